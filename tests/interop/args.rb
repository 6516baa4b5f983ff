# frozen_string_literal: true

# The argument set every interop test sends across, written as Ruby values.
# tests/test_interop_support.py holds the same list as Python values (ARGS);
# a job that receives these must see exactly these types and values.
INTEROP_ARGS = [
  "plain",
  "é",
  "日本",
  "emoji 😀 🎉",
  "",
  "quote \" backslash \\ newline \n tab \t bell \u0007",
  {"clé" => "valeur", "日本" => ["語"]},
  {"nested" => {"list" => [1, [2, {"deep" => nil}]], "flag" => false}, "empty" => {}},
  [[], [1, "two", 3.5], {"k" => "v"}],
  2**63 + 1,
  -(2**70),
  0,
  -1,
  0.1,
  1e300,
  -2.5e-8,
  nil,
  true,
  false
].freeze

# The Ruby class of every value, recursively, so a test can tell an Integer
# from a Float (1e300 must stay a Float, 2**63+1 an Integer).
def interop_types(value)
  case value
  when Array then value.map { |v| interop_types(v) }
  when Hash then value.transform_values { |v| interop_types(v) }
  else value.class.name
  end
end
