# frozen_string_literal: true

# Loaded by every interop script and by worker.rb.
require "json"
require "sidekiq"
require_relative "args"

# redis-rb 4.8 warns about calls Sidekiq 6.4 itself makes; keep the logs readable.
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)
