# frozen_string_literal: true

# Ruby writes the data the dashboard tests read: jobs pushed as a Ruby app
# and a Rails app push them, and dead entries through Sidekiq's own API.
# Prints {"name": jid, ...} as JSON.
#
#   ruby tests/interop/webdata.rb held QUEUE     plain, display_class, ActiveJob and
#                                                mailer jobs in QUEUE (nobody works it)
#   ruby tests/interop/webdata.rb scheduled      the same kinds, an hour from now
#   ruby tests/interop/webdata.rb failing N      N RbFlakyLater jobs (retry entries
#                                                once a Ruby server fails them, with 5
#                                                lines of backtrace, compressed)
#   ruby tests/interop/webdata.rb dying N        N RbFlaky jobs with retry 0 (dead)
#   ruby tests/interop/webdata.rb odd           INTEROP_ARGS (big integers, floats,
#                                                control characters, non-ASCII): an
#                                                RbEcho an hour from now, an RbFlakyLater now
#   ruby tests/interop/webdata.rb slow          an ActiveJob SlowJob that sleeps 3 s in
#                                                the default queue
#   ruby tests/interop/webdata.rb kill           an ActiveJob into the morgue by
#                                                Sidekiq::DeadSet#kill

require "securerandom"
require "time"
require "sidekiq/api"
require_relative "common"

WRAPPER = "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"

# What ActiveJob::Base#serialize returns (Rails 6.1/7.0), arguments already
# serialized: a record as a GlobalID, a symbol-keyed hash with its marker.
def serialized(job_class, queue, arguments)
  {
    "job_class" => job_class, "job_id" => SecureRandom.uuid, "provider_job_id" => nil,
    "queue_name" => queue, "priority" => nil, "arguments" => arguments, "executions" => 0,
    "exception_executions" => {}, "locale" => "en", "timezone" => "UTC",
    "enqueued_at" => Time.now.utc.iso8601(6)
  }
end

# Exactly the hash Rails' ActiveJob::QueueAdapters::SidekiqAdapter#enqueue(_at)
# hands Sidekiq::Client.push ("class" and "wrapped" are classes there; the
# client writes their names).
def rails_push(job_class, queue, arguments, at = nil)
  item = {"class" => WRAPPER, "wrapped" => job_class, "queue" => queue,
          "args" => [serialized(job_class, queue, arguments)]}
  item["at"] = at if at
  Sidekiq::Client.push(item)
end

WELCOME_ARGS = [{"_aj_globalid" => "gid://shop/User/42"}, "aj-needle",
                {"plan" => "gold", "_aj_symbol_keys" => ["plan"]}].freeze
MAILER_ARGS = ["UserMailer", "welcome", "deliver_now",
               {"params" => {"locale" => "fr", "_aj_symbol_keys" => ["locale"]},
                "args" => [{"_aj_globalid" => "gid://shop/User/7"}, "mail-needle"],
                "_aj_ruby2_keywords" => %w[params args]}].freeze

def kinds(queue, at = nil)
  base = {"queue" => queue}
  base["at"] = at if at
  {
    "plain" => Sidekiq::Client.push(base.merge("class" => "RbEcho",
                                               "args" => [1, "plain-needle", {"k" => 2.5}])),
    "shown" => Sidekiq::Client.push(base.merge("class" => "RbEcho", "display_class" => "Shown::AsThis",
                                               "args" => ["shown-needle"])),
    "activejob" => rails_push("WelcomeJob", queue, WELCOME_ARGS, at),
    "mailer" => rails_push("ActionMailer::MailDeliveryJob", queue, MAILER_ARGS, at)
  }
end

def many(klass, count, extra = {})
  (1..count).to_h do |n|
    ["#{klass}#{n}", Sidekiq::Client.push({"class" => klass, "queue" => "default",
                                           "args" => [n, "#{klass}-needle-#{n}"]}.merge(extra))]
  end
end

def kill
  jid = SecureRandom.hex(12)
  job = {"class" => WRAPPER, "wrapped" => "WelcomeJob", "queue" => "default",
         "args" => [serialized("WelcomeJob", "default", WELCOME_ARGS)], "jid" => jid,
         "retry" => true, "created_at" => Time.now.to_f, "enqueued_at" => Time.now.to_f,
         "error_class" => "RuntimeError", "error_message" => "killed from Ruby",
         "failed_at" => Time.now.to_f, "retry_count" => 3}
  Sidekiq::DeadSet.new.kill(Sidekiq.dump_json(job))
  {"killed" => jid}
end

command = ARGV.fetch(0)
out =
  case command
  when "held" then kinds(ARGV.fetch(1))
  when "scheduled" then kinds("default", Time.now.to_f + 3600)
  when "failing" then many("RbFlakyLater", Integer(ARGV.fetch(1)), "backtrace" => 5)
  when "dying" then many("RbFlaky", Integer(ARGV.fetch(1)), "retry" => 0)
  when "kill" then kill
  when "slow" then {"slow" => rails_push("SlowJob", "default", [3, "slow-needle"])}
  when "odd"
    {"scheduled" => Sidekiq::Client.push("class" => "RbEcho", "args" => INTEROP_ARGS,
                                         "at" => Time.now.to_f + 3600),
     "failing" => Sidekiq::Client.push("class" => "RbFlakyLater", "args" => INTEROP_ARGS)}
  else abort "unknown command #{command}"
  end
puts JSON.generate(out)
