# frozen_string_literal: true

# How Ruby writes floats, and Sidekiq's reschedule of a wurk-written entry.
#
#   ruby tests/interop/floats.rb generate FILE
#       FILE holds one float literal a line; prints a JSON array of
#       JSON.generate(Float(line)) for each, as Ruby's JSON writes them
#   ruby tests/interop/floats.rb reschedule JID SECONDS
#       Sidekiq::ScheduledSet#find_job(JID).reschedule(now + SECONDS); prints
#       the scheduled set's members and scores afterwards

require "sidekiq/api"
require_relative "common"

case ARGV[0]
when "generate"
  puts JSON.generate(File.readlines(ARGV[1]).map { |line| JSON.generate(Float(line.strip)) })
when "reschedule"
  set = Sidekiq::ScheduledSet.new
  set.find_job(ARGV[1]).reschedule(Time.now.to_f + Float(ARGV[2]))
  puts JSON.generate(set.map { |entry| { "score" => entry.score, "jid" => entry.jid } })
else
  abort "usage: floats.rb generate FILE | reschedule JID SECONDS"
end
