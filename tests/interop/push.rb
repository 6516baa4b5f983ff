# frozen_string_literal: true

# Ruby → Python: push PyEcho jobs the ways a Ruby app does, and print
# {"jids": [...], ...} as JSON.
#
#   ruby tests/interop/push.rb client_push|perform_async|push_bulk|perform_in [DELAY]

require_relative "common"

# A stub named like the Python job: Ruby never runs it, it only enqueues it.
class PyEcho
  include Sidekiq::Worker
end

how = ARGV.fetch(0)
out = {}
case how
when "client_push"
  out["jids"] = [Sidekiq::Client.push("class" => "PyEcho", "args" => INTEROP_ARGS)]
when "perform_async"
  out["jids"] = [PyEcho.perform_async(*INTEROP_ARGS)]
when "push_bulk"
  bulk = [INTEROP_ARGS, INTEROP_ARGS.reverse, ["bulk", 3]]
  out["jids"] = Sidekiq::Client.push_bulk("class" => "PyEcho", "args" => bulk)
  out["args"] = bulk
when "perform_in"
  delay = Float(ARGV.fetch(1))
  out["at"] = Time.now.to_f + delay
  out["jids"] = [PyEcho.perform_in(delay, *INTEROP_ARGS)]
else
  abort "unknown push method #{how}"
end
puts JSON.generate(out)
