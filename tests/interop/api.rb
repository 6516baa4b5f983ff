# frozen_string_literal: true

# Sidekiq's own API (sidekiq/api) run from Ruby against the shared Redis.
#
#   ruby tests/interop/api.rb dump
#       everything Stats, Queue, ProcessSet, Workers and the three sorted
#       sets report, as JSON
#   ruby tests/interop/api.rb retry|kill|add_to_queue retry|scheduled|dead [JID]
#       act on every entry of the set (or the one with JID); prints the jids
#   ruby tests/interop/api.rb quiet|stop IDENTITY
#       signal a process through Sidekiq::Process#quiet! / #stop!

require "time"
require "sidekiq/api"
require_relative "common"

def time_of(value)
  value && Time.at(value).utc
end

def job_fields(record)
  {
    "jid" => record.jid, "class" => record["class"], "klass" => record.klass,
    "display_class" => record.display_class, "args" => record.args,
    "display_args" => record.display_args, "queue" => record.queue,
    "enqueued_at" => record.enqueued_at&.to_f, "created_at" => record.created_at.to_f,
    "latency" => record.latency, "tags" => record.tags
  }
end

def entry_fields(entry)
  failed_at = time_of(entry["failed_at"])
  job_fields(entry).merge(
    "at" => entry.at.to_f, "at_iso" => entry.at.iso8601(3), "score" => entry.score,
    "error" => entry.error?, "error_class" => entry["error_class"],
    "error_message" => entry["error_message"], "retry_count" => entry["retry_count"],
    "retry" => entry["retry"], "failed_at_class" => failed_at&.class&.name,
    "failed_at" => failed_at&.to_f, "failed_at_iso" => failed_at&.iso8601(3),
    "retried_at" => time_of(entry["retried_at"])&.to_f,
    "error_backtrace" => entry.error_backtrace
  )
end

def process_fields(process)
  %w[identity hostname pid concurrency busy beat tag labels quiet rss rtt_us started_at
     queues].to_h { |key| [key, process[key]] }.merge(
    "queues" => process.queues, "tag" => process.tag, "labels" => process.labels,
    "stopping" => process.stopping?
  )
end

def dump
  stats = Sidekiq::Stats.new
  processes = Sidekiq::ProcessSet.new(false)
  workers = Sidekiq::Workers.new
  {
    "version" => Sidekiq::VERSION,
    "stats" => {
      "processed" => stats.processed, "failed" => stats.failed,
      "scheduled_size" => stats.scheduled_size, "retry_size" => stats.retry_size,
      "dead_size" => stats.dead_size, "processes_size" => stats.processes_size,
      "workers_size" => stats.workers_size, "enqueued" => stats.enqueued,
      "default_queue_latency" => stats.default_queue_latency, "queues" => stats.queues
    },
    "history" => Sidekiq::Stats::History.new(1).processed,
    "queues" => Sidekiq::Queue.all.map do |queue|
      {"name" => queue.name, "size" => queue.size, "latency" => queue.latency,
       "jobs" => queue.map { |job| job_fields(job) }}
    end,
    "processes" => processes.map { |process| process_fields(process) },
    "total_concurrency" => processes.total_concurrency,
    "workers" => workers.map do |process, thread, work|
      payload = work["payload"]
      {"process" => process, "thread" => thread, "queue" => work["queue"],
       "run_at" => work["run_at"], "run_at_iso" => Time.at(work["run_at"]).utc.iso8601,
       "class" => payload["class"], "jid" => payload["jid"], "args" => payload["args"],
       "display_class" => Sidekiq::JobRecord.new(payload).display_class}
    end,
    "workers_size" => workers.size,
    "retry" => Sidekiq::RetrySet.new.map { |entry| entry_fields(entry) },
    "scheduled" => Sidekiq::ScheduledSet.new.map { |entry| entry_fields(entry) },
    "dead" => Sidekiq::DeadSet.new.map { |entry| entry_fields(entry) }
  }
end

SETS = {
  "retry" => Sidekiq::RetrySet, "scheduled" => Sidekiq::ScheduledSet, "dead" => Sidekiq::DeadSet
}.freeze

def act(action, set_name, jid)
  entries = SETS.fetch(set_name).new.to_a
  entries.select! { |entry| entry.jid == jid } if jid
  entries.each(&action.to_sym)
  {"jids" => entries.map(&:jid)}
end

def signal(action, identity)
  process = Sidekiq::ProcessSet.new(false).find { |p| p.identity == identity }
  abort "no process #{identity}" unless process
  action == "quiet" ? process.quiet! : process.stop!
  {"identity" => identity}
end

command = ARGV.fetch(0)
result =
  case command
  when "dump" then dump
  when "retry", "kill", "add_to_queue" then act(command, ARGV.fetch(1), ARGV[2])
  when "quiet", "stop" then signal(command, ARGV.fetch(1))
  else abort "unknown command #{command}"
  end
puts JSON.generate(result)
