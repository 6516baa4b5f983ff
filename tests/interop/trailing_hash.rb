# frozen_string_literal: true

# Ruby -> Python: a Ruby app's trailing hash, pushed the ways a Ruby app
# pushes one to a job named PyTrailing; prints {"pushed": [{"jid", "args"}]}
# with each job's args as JSON carries them (symbol keys become strings).
#
#   ruby tests/interop/trailing_hash.rb

require_relative "common"

# Sidekiq 6.4 logs to stdout that a symbol-keyed hash (keyword syntax) does not
# serialize to JSON safely; keep stdout for the JSON this script prints.
Sidekiq.logger = Sidekiq::Logger.new($stderr)

# A stub named like the Python job: Ruby never runs it, it only enqueues it.
class PyTrailing
  include Sidekiq::Worker
end

pushes = [
  [[42, { "address" => "ada@example.com", "n" => 1 }],
   -> { PyTrailing.perform_async(42, { "address" => "ada@example.com", "n" => 1 }) }],
  # Ruby keyword syntax: perform_async(*args) collects it as a trailing hash.
  [[43, { "address" => "bob@example.com" }],
   -> { PyTrailing.perform_async(43, address: "bob@example.com") }],
  [[{ "only" => { "nested" => [1, nil, { "deep" => true }] } }],
   -> { PyTrailing.perform_async({ "only" => { "nested" => [1, nil, { "deep" => true }] } }) }],
  [[44, {}],
   -> { Sidekiq::Client.push("class" => "PyTrailing", "args" => [44, {}]) }],
]
out = pushes.map { |args, push| { "jid" => push.call, "args" => JSON.parse(JSON.generate(args)) } }
# A Ruby client may opt in to wurk's keywords by writing the marker itself.
marked = [45, { "address" => "cy@example.com" }]
out << { "jid" => Sidekiq::Client.push("class" => "PyTrailing", "args" => marked, "kwargs" => true),
         "args" => marked, "marked" => true }
puts JSON.generate({ "pushed" => out })
