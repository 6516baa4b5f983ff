# Ruby Sidekiq's benchmark job, loaded by `sidekiq -r` and by sidekiq_enqueue.rb.
#
# BenchJob#perform(shape, ts) does what bench/peers/common.py's job does:
# RPUSH now - ts to bench:lat when ts is non-zero, then the shape's work
# (noop: nothing; cpu: an arithmetic loop of about 2 ms; io: sleep 10 ms),
# then INCR bench:done, through Sidekiq's own Redis pool.
#
# BENCH_SIDEKIQ_DRIVER=hiredis selects redis-rb's hiredis driver (Debian's
# ruby-hiredis); anything else keeps redis-rb's pure-Ruby driver.
require "sidekiq"

module Bench
  DONE_KEY = "bench:done"
  LAT_KEY = "bench:lat"
  EXTRA_KEY = "bench:extra"
  # As bench/peers/common.py: INCRs before the counted one (harness --extra-incrs).
  EXTRA_INCRS = Integer(ENV.fetch("BENCH_EXTRA_INCRS", "0"))
  # Ruby 3.1 runs this loop about 2.4x faster than CPython 3.11, so the count
  # is scaled to take the same ~2 ms as CPU_ITERATIONS = 36 000 in Python.
  CPU_ITERATIONS = 86_000
  IO_SECONDS = 0.010

  def self.cpu_loop(n = CPU_ITERATIONS)
    x = 0
    i = 0
    while i < n
      x = (x + i * i) % 1000003
      i += 1
    end
    x
  end

  def self.redis_options
    options = { url: ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379/0") }
    options[:size] = Integer(ENV["BENCH_SIDEKIQ_POOL"]) if ENV["BENCH_SIDEKIQ_POOL"]
    if ENV["BENCH_SIDEKIQ_DRIVER"] == "hiredis"
      require "hiredis"
      require "redis/connection/hiredis"
      options[:driver] = :hiredis
    end
    options
  end
end

Sidekiq.configure_server do |config|
  config.redis = Bench.redis_options
  config.logger.level = Logger::WARN
end

Sidekiq.configure_client do |config|
  config.redis = Bench.redis_options
end

class BenchJob
  include Sidekiq::Worker

  def perform(shape, ts)
    if ts && ts != 0
      latency = Time.now.to_f - ts
      Sidekiq.redis { |r| r.rpush(Bench::LAT_KEY, latency) }
    end
    case shape
    when "cpu" then Bench.cpu_loop
    when "io" then sleep(Bench::IO_SECONDS)
    end
    Bench::EXTRA_INCRS.times { Sidekiq.redis { |r| r.incr(Bench::EXTRA_KEY) } }
    Sidekiq.redis { |r| r.incr(Bench::DONE_KEY) }
  end
end
