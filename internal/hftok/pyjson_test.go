package hftok

import (
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestTojsonIsPythonsJSONDumps: the tojson filter templates get writes what
// Python's json.dumps writes for the value json.loads reads (the wanted
// strings are Python 3's outputs): key order, a repeated key, floats,
// escapes, ensure_ascii, indent, sort_keys and separators.
func TestTojsonIsPythonsJSONDumps(t *testing.T) {
	for _, c := range []struct{ in, dumps, ascii, indent2, sortedCompact string }{
		{"{\"b\": 1, \"a\": [1], \"a\": {\"dup\": true}}", "{\"b\": 1, \"a\": {\"dup\": true}}", "{\"b\": 1, \"a\": {\"dup\": true}}", "{\n  \"b\": 1,\n  \"a\": {\n    \"dup\": true\n  }\n}", "{\"a\":{\"dup\":true},\"b\":1}"},
		{"[1.0, -0.0, 1e16, 1.5e16, 1e-05, 0.0001, 123456789012345.6, 1e22, 3.14, -2.5e-07, 100, -7, 0.1, 2.50, 1e15, 9007199254740993]", "[1.0, -0.0, 1e+16, 1.5e+16, 1e-05, 0.0001, 123456789012345.6, 1e+22, 3.14, -2.5e-07, 100, -7, 0.1, 2.5, 1000000000000000.0, 9007199254740993]", "[1.0, -0.0, 1e+16, 1.5e+16, 1e-05, 0.0001, 123456789012345.6, 1e+22, 3.14, -2.5e-07, 100, -7, 0.1, 2.5, 1000000000000000.0, 9007199254740993]", "[\n  1.0,\n  -0.0,\n  1e+16,\n  1.5e+16,\n  1e-05,\n  0.0001,\n  123456789012345.6,\n  1e+22,\n  3.14,\n  -2.5e-07,\n  100,\n  -7,\n  0.1,\n  2.5,\n  1000000000000000.0,\n  9007199254740993\n]", "[1.0,-0.0,1e+16,1.5e+16,1e-05,0.0001,123456789012345.6,1e+22,3.14,-2.5e-07,100,-7,0.1,2.5,1000000000000000.0,9007199254740993]"},
		{"\"tab\\t nl\\n ctl\\u0001 bell\\u0007 bs\\b ff\\f quote\\\" back\\\\ slash/ uni é 😀 ls\\u2028 <>&\"", "\"tab\\t nl\\n ctl\\u0001 bell\\u0007 bs\\b ff\\f quote\\\" back\\\\ slash/ uni é 😀 ls  <>&\"", "\"tab\\t nl\\n ctl\\u0001 bell\\u0007 bs\\b ff\\f quote\\\" back\\\\ slash/ uni \\u00e9 \\ud83d\\ude00 ls\\u2028 <>&\"", "\"tab\\t nl\\n ctl\\u0001 bell\\u0007 bs\\b ff\\f quote\\\" back\\\\ slash/ uni é 😀 ls  <>&\"", "\"tab\\t nl\\n ctl\\u0001 bell\\u0007 bs\\b ff\\f quote\\\" back\\\\ slash/ uni é 😀 ls  <>&\""},
		{"[null, false, true, {}, [], {\"\": \"\"}]", "[null, false, true, {}, [], {\"\": \"\"}]", "[null, false, true, {}, [], {\"\": \"\"}]", "[\n  null,\n  false,\n  true,\n  {},\n  [],\n  {\n    \"\": \"\"\n  }\n]", "[null,false,true,{},[],{\"\":\"\"}]"},
		{"1E400", "Infinity", "Infinity", "Infinity", "Infinity"},
	} {
		v, err := valueFromJSON([]byte(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		for _, k := range []struct {
			want   string
			kwargs map[string]jinja.Value
		}{
			{c.dumps, nil},
			{c.ascii, map[string]jinja.Value{"ensure_ascii": jinja.NewBool(true)}},
			{c.indent2, map[string]jinja.Value{"indent": jinja.NewInt(2)}},
			{c.sortedCompact, map[string]jinja.Value{"sort_keys": jinja.NewBool(true), "separators": jinja.NewList([]jinja.Value{jinja.NewString(","), jinja.NewString(":")})}},
		} {
			got, err := pyTojson.AsCallable().Fn([]jinja.Value{v}, k.kwargs)
			if err != nil || got.AsString() != k.want {
				t.Errorf("tojson(%s, %v) = %q (err %v), want %q", c.in, k.kwargs, got, err, k.want)
			}
		}
	}
}

func TestValueFromJSONRefuses(t *testing.T) {
	for _, in := range []string{``, `{`, `[1,]`, `01`, `1.`, `-`, `+1`, `0x10`, `nul`, `"a`, `{"a" 1}`, `99999999999999999999`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000)} {
		if _, err := valueFromJSON([]byte(in)); err == nil {
			t.Errorf("valueFromJSON(%q) accepted", in)
		}
	}
}
