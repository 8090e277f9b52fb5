// Package jsontop walks the top level of a JSON object without decoding
// the values nobody reads: the request parser reads a few fields of a body
// that is mostly "messages", the observer the "usage" of an answer that is
// mostly "choices" (docs/benchmarks/LAB-2026.md, "Proxy efficiency vs NGINX": json.Unmarshal of the whole answer was 5% of
// the proxy's CPU).
package jsontop

import (
	"bytes"
	"encoding/json"
)

// SkipSpace returns the index of the first byte at or after i of d that is
// not JSON white space.
func SkipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\r' || d[i] == '\n') {
		i++
	}
	return i
}

// SkipValue returns the end of the JSON value starting at d[i]: strings
// and nesting are followed, nothing is checked (the caller validates the
// value it gets, so a malformed one ends somewhere harmless).
func SkipValue(d []byte, i int) int {
	depth := 0
	for ; i < len(d); i++ {
		switch d[i] {
		case '"':
			if i = stringEnd(d, i+1); i >= len(d) { // unterminated: the caller's validation fails
				return len(d)
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // a scalar's end: the enclosing object closes
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\r', '\n', ':':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// stringEnd returns the index of the quote that closes a string whose
// text starts at d[i] (len(d) when none does): the next quote not
// escaped, found with bytes.IndexByte (a prompt's text is most of a body).
func stringEnd(d []byte, i int) int {
	for {
		j := bytes.IndexByte(d[i:], '"')
		if j < 0 {
			return len(d)
		}
		j += i
		k := j
		for k > i && d[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 { // an even run of backslashes escapes nothing
			return j
		}
		i = j + 1
	}
}

// Members calls member with the key (unescaped) and the raw value of each
// member of the JSON object d, in order; the values are sub-slices of d,
// neither decoded nor validated. It reports false when d is not an object
// as far as its top level shows (a missing quote, colon, comma or brace, a
// bad escape in a key, bytes after the end) or when member returned false.
func Members(d []byte, member func(key, value []byte) bool) bool {
	i := SkipSpace(d, 0)
	if i >= len(d) || d[i] != '{' {
		return false
	}
	if i = SkipSpace(d, i+1); i < len(d) && d[i] == '}' {
		return SkipSpace(d, i+1) == len(d)
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return false
		}
		end := SkipValue(d, i)
		if end-i < 2 || d[end-1] != '"' {
			return false
		}
		key := d[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if json.Unmarshal(d[i:end], &s) != nil {
				return false
			}
			key = []byte(s)
		}
		if i = SkipSpace(d, end); i >= len(d) || d[i] != ':' {
			return false
		}
		if i = SkipSpace(d, i+1); i >= len(d) {
			return false
		}
		end = SkipValue(d, i)
		if end == i || !member(key, d[i:end]) {
			return false
		}
		i = SkipSpace(d, end)
		switch {
		case i < len(d) && d[i] == ',':
			i = SkipSpace(d, i+1)
		case i < len(d) && d[i] == '}':
			return SkipSpace(d, i+1) == len(d)
		default:
			return false
		}
	}
}

// Elements calls element with each raw value of the JSON array d, in
// order, as Members does for an object's members; it reports false when d
// is not an array as far as its top level shows or when element returned
// false.
func Elements(d []byte, element func(value []byte) bool) bool {
	i := SkipSpace(d, 0)
	if i >= len(d) || d[i] != '[' {
		return false
	}
	if i = SkipSpace(d, i+1); i < len(d) && d[i] == ']' {
		return SkipSpace(d, i+1) == len(d)
	}
	for {
		if i >= len(d) {
			return false
		}
		end := SkipValue(d, i)
		if end == i || !element(d[i:end]) {
			return false
		}
		i = SkipSpace(d, end)
		switch {
		case i < len(d) && d[i] == ',':
			i = SkipSpace(d, i+1)
		case i < len(d) && d[i] == ']':
			return SkipSpace(d, i+1) == len(d)
		default:
			return false
		}
	}
}
