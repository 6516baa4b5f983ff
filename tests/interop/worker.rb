# frozen_string_literal: true

# Ruby Sidekiq jobs for the interop tests, loaded by
#   REDIS_URL=... sidekiq -r tests/interop/worker.rb -q default -c 2
#
# Every job records what it received in the Redis list "interop:ruby-runs"
# as one JSON object: class, jid, queue, args, the Ruby class of every
# argument (so an Integer and a Float can be told apart), the whole job hash
# as the server saw it, the time it ran and this process's pid.

require_relative "common"

RUNS_KEY = "interop:ruby-runs"

# Test-speed settings. None of them changes what goes over the wire:
# - the poller checks schedule/retry about twice a second and skips its
#   5-15 s initial wait;
# - the heartbeat (process hash, busy count, stats flush, signal pop) runs
#   every second instead of every 5 s.
Sidekiq.options[:poll_interval_average] = 0.5
Sidekiq::Scheduled::Poller.prepend(Module.new do
  def initial_wait; end
end)
Sidekiq::Launcher.send(:remove_const, :BEAT_PAUSE)
Sidekiq::Launcher.const_set(:BEAT_PAUSE, 1)

# Hands the job hash to the job (Sidekiq 6.4 jobs only get their args).
class InteropCurrentJob
  def call(_worker, job, _queue)
    Thread.current[:interop_job] = job
    yield
  ensure
    Thread.current[:interop_job] = nil
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add InteropCurrentJob }
end

module InteropRecording
  def record(args, extra = {})
    job = Thread.current[:interop_job] || {}
    entry = {
      "class" => self.class.name, "jid" => jid, "queue" => job["queue"], "args" => args,
      "types" => interop_types(args), "job" => job, "ran_at" => Time.now.to_f,
      "pid" => ::Process.pid
    }.merge(extra)
    Sidekiq.redis { |conn| conn.rpush(RUNS_KEY, JSON.generate(entry)) }
  end
end

# Records its args.
class RbEcho
  include Sidekiq::Worker
  include InteropRecording

  def perform(*args)
    record(args)
  end
end

# Records that it started, then sleeps args[0] seconds (at most 10).
class RbSlow
  include Sidekiq::Worker
  include InteropRecording

  def perform(*args)
    record(args)
    sleep([args.first.to_f, 10].min)
  end
end

# Fails the first time it runs for a jid, records its args on later runs.
class RbFlaky
  include Sidekiq::Worker
  include InteropRecording

  def perform(*args)
    attempt = Sidekiq.redis { |conn| conn.incr("interop:attempts:#{jid}") }
    raise "flaky failure on attempt #{attempt}" if attempt == 1

    record(args, "attempt" => attempt)
  end
end

# RbFlaky whose retry waits an hour, so its retry entry stays put for the
# dashboard tests (Sidekiq's own backoff would bring it back in 15-25 s).
class RbFlakyLater < RbFlaky
  sidekiq_retry_in { 3600 }
end

# Stands in for Rails' ActiveJob wrapper (the class a Rails app's Sidekiq
# adapter pushes): records the serialized ActiveJob it was handed.
module ActiveJob
  module QueueAdapters
    class SidekiqAdapter
      class JobWrapper
        include Sidekiq::Worker
        include InteropRecording

        def perform(job_data)
          record([job_data])
          # A "SlowJob" sleeps its first argument's seconds (at most 10), to be seen busy.
          sleep([job_data["arguments"].first.to_f, 10].min) if job_data["job_class"] == "SlowJob"
        end
      end
    end
  end
end
