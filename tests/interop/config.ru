# frozen_string_literal: true

# Sidekiq's web UI against REDIS_URL, for the interop tests:
#   REDIS_URL=... rackup -s webrick -o 127.0.0.1 -p PORT tests/interop/config.ru
require "rack/session/cookie"
require "sidekiq/web"
require_relative "common"

use Rack::Session::Cookie, secret: "x" * 64, same_site: true, max_age: 86_400
run Sidekiq::Web
