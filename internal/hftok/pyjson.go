package hftok

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/llmlb/llmlb/internal/jsontop"
)

// tojsonFilter is the name templates' tojson filter is renamed to
// (renameTojson): the template engine's own tojson writes floats and
// indented output as Go does, and the filter transformers gives Jinja2 is
// Python's json.dumps (pyJSON).
const tojsonFilter = "llmlb_tojson"

// pyTojson is transformers' tojson filter: json.dumps(x,
// ensure_ascii=False, indent=None, separators=None, sort_keys=False),
// each overridable by keyword.
var pyTojson = jinja.NewCallable(tojsonFilter, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	opt := pyJSONOptions{item: ", ", key: ": "}
	if v, ok := kwargs["ensure_ascii"]; ok {
		opt.ascii = v.IsTruthy()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		opt.sortKeys = v.IsTruthy()
	}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			opt.indent = strings.Repeat(" ", max(0, int(v.AsInt())))
		case v.IsString():
			opt.indent = v.AsString()
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
		opt.indented, opt.item = true, ","
	}
	if v, ok := kwargs["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		opt.item, opt.key = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	var b strings.Builder
	if err := pyJSON(&b, args[0], opt, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
})

type pyJSONOptions struct {
	item, key string
	indent    string
	indented  bool
	ascii     bool
	sortKeys  bool
}

// pyJSON writes v as Python's json.dumps writes the same value: dicts in
// their keys' order, floats as Python's repr, strings escaped as Python
// escapes them.
func pyJSON(b *strings.Builder, v jinja.Value, opt pyJSONOptions, depth int) error {
	switch {
	case v.IsNone(), v.IsUndefined():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		pyString(b, v.AsString(), opt.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, item := range items {
			if i > 0 {
				b.WriteString(opt.item)
			}
			opt.newline(b, depth+1)
			if err := pyJSON(b, item, opt, depth+1); err != nil {
				return err
			}
		}
		opt.newline(b, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if opt.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(opt.item)
			}
			opt.newline(b, depth+1)
			pyString(b, k, opt.ascii)
			b.WriteString(opt.key)
			val, _ := d.Get(k)
			if err := pyJSON(b, val, opt, depth+1); err != nil {
				return err
			}
		}
		opt.newline(b, depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot serialize %s", v.String())
	}
	return nil
}

func (o pyJSONOptions) newline(b *strings.Builder, depth int) {
	if o.indented {
		b.WriteByte('\n')
		for range depth {
			b.WriteString(o.indent)
		}
	}
}

// PythonFloat is Python's str of a float (pyFloat).
func PythonFloat(f float64) string { return pyFloat(f) }

// pyFloat is Python's repr of a float, as json.dumps writes it: the
// shortest digits that read back the same, in positional notation for
// exponents from -4 to 15 (with ".0" for whole numbers) and scientific
// notation (1e-05, 1.5e+16) beyond.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expPart, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expPart)
	sign := ""
	if mant[0] == '-' {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// pyString writes s as a JSON string the way Python's json module does:
// quote, backslash and the control characters escaped (\n, \r, \t, \b, \f
// by name, the others as \u00XX), nothing else unless ascii (then every
// non-ASCII character as \uXXXX, astral ones as surrogate pairs).
func pyString(b *strings.Builder, s string, ascii bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ascii && r > 0x7e && r <= 0xffff):
				b.WriteString(`\u`)
				b.WriteByte(hex[r>>12&0xf])
				b.WriteByte(hex[r>>8&0xf])
				b.WriteByte(hex[r>>4&0xf])
				b.WriteByte(hex[r&0xf])
			case ascii && r > 0xffff:
				r -= 0x10000
				for _, u := range [2]rune{0xd800 + r>>10, 0xdc00 + r&0x3ff} {
					b.WriteString(`\u`)
					b.WriteByte(hex[u>>12&0xf])
					b.WriteByte(hex[u>>8&0xf])
					b.WriteByte(hex[u>>4&0xf])
					b.WriteByte(hex[u&0xf])
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// ErrJSONValue is returned by valueFromJSON for JSON Python reads into a
// value the template engine cannot hold (an integer beyond 64 bits).
var ErrJSONValue = errors.New("hftok: a JSON number the template engine cannot hold")

// valueFromJSON decodes JSON into a template value as Python's json.loads
// decodes it: objects keep their keys in order (a repeated key keeps its
// first place and its last value), integers stay integers and other
// numbers become floats.
func valueFromJSON(raw []byte) (jinja.Value, error) { return decodeJSON(raw, 0) }

// maxJSONDepth bounds the nesting valueFromJSON follows (encoding/json's
// own bound is 10,000).
const maxJSONDepth = 1000

func decodeJSON(raw []byte, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), errors.New("hftok: JSON nested too deep")
	}
	d := bytes.TrimSpace(raw)
	if len(d) == 0 {
		return jinja.Undefined(), errors.New("hftok: no JSON value")
	}
	var err error
	switch d[0] {
	case '{':
		dict := jinja.NewDict()
		ok := jsontop.Members(d, func(k, v []byte) bool {
			var val jinja.Value
			if val, err = decodeJSON(v, depth+1); err != nil {
				return false
			}
			dict.AsDict().Set(string(k), val)
			return true
		})
		if !ok {
			return jinja.Undefined(), cmp.Or(err, errors.New("hftok: a malformed JSON object"))
		}
		return dict, nil
	case '[':
		var items []jinja.Value
		ok := jsontop.Elements(d, func(v []byte) bool {
			var val jinja.Value
			if val, err = decodeJSON(v, depth+1); err != nil {
				return false
			}
			items = append(items, val)
			return true
		})
		if !ok {
			return jinja.Undefined(), cmp.Or(err, errors.New("hftok: a malformed JSON array"))
		}
		return jinja.NewList(items), nil
	case '"':
		if len(d) >= 2 && d[len(d)-1] == '"' && bytes.IndexByte(d[1:len(d)-1], '\\') < 0 && bytes.IndexByte(d[1:len(d)-1], '"') < 0 && utf8.Valid(d) {
			return jinja.NewString(string(d[1 : len(d)-1])), nil
		}
		var str string
		if err := json.Unmarshal(d, &str); err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(str), nil
	}
	switch string(d) {
	case "null":
		return jinja.None(), nil
	case "true":
		return jinja.NewBool(true), nil
	case "false":
		return jinja.NewBool(false), nil
	}
	if !isJSONNumber(d) {
		return jinja.Undefined(), fmt.Errorf("hftok: %.20q is not a JSON value", d)
	}
	if bytes.IndexAny(d, ".eE") < 0 {
		i, err := strconv.ParseInt(string(d), 10, 64)
		if err != nil {
			return jinja.Undefined(), ErrJSONValue
		}
		return jinja.NewInt(i), nil
	}
	f, err := strconv.ParseFloat(string(d), 64)
	if err != nil && !math.IsInf(f, 0) {
		return jinja.Undefined(), err
	}
	return jinja.NewFloat(f), nil // Python reads 1e999 as inf
}

// isJSONNumber reports whether d is a number in JSON's grammar.
func isJSONNumber(d []byte) bool {
	i := 0
	if i < len(d) && d[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i, n = i+1, n+1
		}
		return n
	}
	start := i
	if n := digits(); n == 0 || (n > 1 && d[start] == '0') {
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(d)
}
