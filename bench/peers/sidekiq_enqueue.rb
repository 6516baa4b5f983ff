# Ruby Sidekiq's enqueuer for bench/harness.py; prints one JSON line.
#
#   ruby bench/peers/sidekiq_enqueue.rb bulk N SHAPE           (push_bulk, 1 000 per call)
#   ruby bench/peers/sidekiq_enqueue.rb paced RATE SECONDS SHAPE  (one push per job)
require "json"
require_relative "sidekiq_jobs"

BULK = 1000

def now
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

Sidekiq.redis { |r| r.ping }
mode = ARGV[0]
case mode
when "bulk"
  n = Integer(ARGV[1])
  shape = ARGV[2]
  started = now
  (0...n).step(BULK) do |start|
    count = [BULK, n - start].min
    Sidekiq::Client.push_bulk("class" => "BenchJob", "args" => Array.new(count) { [shape, 0] })
  end
  puts JSON.generate(jobs: n, seconds: now - started)
when "paced"
  rate = Float(ARGV[1])
  total = (rate * Float(ARGV[2])).to_i
  shape = ARGV[3]
  started = now
  total.times do |i|
    delay = started + i / rate - now
    sleep(delay) if delay > 0
    Sidekiq::Client.push("class" => "BenchJob", "args" => [shape, Time.now.to_f])
  end
  puts JSON.generate(jobs: total, seconds: now - started)
else
  warn "unknown mode #{mode.inspect}"
  exit 2
end
