# Ruby Sidekiq's enqueuer for bench/harness.py; prints one JSON line.
#
#   ruby bench/peers/sidekiq_enqueue.rb bulk N SHAPE           (push_bulk, 1 000 per call)
#   ruby bench/peers/sidekiq_enqueue.rb paced RATE SECONDS SHAPE  (one push per job)
#
# And for bench/enqueue.py, which reads Redis INFO around the timed part: they
# print "ready", wait for a line on stdin, push, print one JSON line, and wait
# for another line before exiting (BENCH_SIDEKIQ_POOL sets the pool size).
#
#   ruby bench/peers/sidekiq_enqueue.rb bulk-go N          (push_bulk of [i], 1 000 per call)
#   ruby bench/peers/sidekiq_enqueue.rb threads N THREADS  (perform_async(i) from THREADS threads)
require "json"
require_relative "sidekiq_jobs"

BULK = 1000

module Bench
  def self.on_go
    # redis-rb 4.8 warns on stderr at every SADD Sidekiq 6.4 sends: a write per push.
    Redis.silence_deprecations = true
    $stdout.sync = true
    puts "ready"
    $stdin.gets
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end

  def self.finish(seconds)
    puts JSON.generate(seconds: seconds)
    $stdin.gets
  end
end

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
when "bulk-go"
  n = Integer(ARGV[1])
  slices = (0...n).step(BULK).map { |start| (start...[start + BULK, n].min).map { |i| [i] } }
  seconds = Bench.on_go do
    slices.each { |args| Sidekiq::Client.push_bulk("class" => BenchJob, "args" => args) }
  end
  Bench.finish(seconds)
when "threads"
  n = Integer(ARGV[1])
  threads = Integer(ARGV[2])
  seconds = Bench.on_go do
    threads.times.map do |first|
      Thread.new { first.step(n - 1, threads) { |i| BenchJob.perform_async(i) } }
    end.each(&:join)
  end
  Bench.finish(seconds)
else
  warn "unknown mode #{mode.inspect}"
  exit 2
end
