package jsontop

import (
	"slices"
	"testing"
)

func TestMembers(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want []string // key=value pairs; nil when Members fails
	}{
		{"empty", ` { } `, []string{}},
		{"members", `{"a":1,"b" : {"c":[1,"}"]}, "d":"x\"y"}`, []string{`a=1`, `b={"c":[1,"}"]}`, `d="x\"y"`}},
		{"escaped key", `{"m\u006fdel":"x"}`, []string{`model="x"`}},
		{"repeated key", `{"a":1,"a":null}`, []string{`a=1`, `a=null`}},
		{"not an object", `[1]`, nil},
		{"trailing comma", `{"a":1,}`, nil},
		{"no colon", `{"a" 1}`, nil},
		{"no value", `{"a":}`, nil},
		{"unterminated", `{"a":1`, nil},
		{"bytes after", `{"a":1} x`, nil},
		{"bad escape in key", `{"\x":1}`, nil},
		{"empty input", ``, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := []string{}
			ok := Members([]byte(c.in), func(k, v []byte) bool {
				got = append(got, string(k)+"="+string(v))
				return true
			})
			if !ok {
				got = nil
			}
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("Members(%s) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestElements(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want []string // nil when Elements fails
	}{
		{"empty", ` [ ] `, []string{}},
		{"elements", `[1, "a]" ,{"b":[2]}, null]`, []string{`1`, `"a]"`, `{"b":[2]}`, `null`}},
		{"escapes", `["a\\", "b\\\"c", "\\\\", "\""]`, []string{`"a\\"`, `"b\\\"c"`, `"\\\\"`, `"\""`}},
		{"not an array", `{"a":1}`, nil},
		{"trailing comma", `[1,]`, nil},
		{"unterminated", `[1`, nil},
		{"bytes after", `[1] x`, nil},
		{"empty input", ``, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := []string{}
			ok := Elements([]byte(c.in), func(v []byte) bool {
				got = append(got, string(v))
				return true
			})
			if !ok {
				got = nil
			}
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("Elements(%s) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}
