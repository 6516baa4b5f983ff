"""The Sidekiq wire format: key names, Lua scripts and payload codecs."""
