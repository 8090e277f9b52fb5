package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/keyname"
	"github.com/llmlb/llmlb/internal/policy"
	"gopkg.in/yaml.v3"
)

// maxFileBytes bounds a configuration file; real ones are a few KiB.
const maxFileBytes = 4 << 20

// Error is one problem with a configuration. It names the key (a dotted path
// such as routing.affinity.session_ttl or replicas[1].url) and, when it came
// from a file, the file and line.
type Error struct {
	Source string // file name; "" when not known
	Line   int    // 1-based; 0 when not known
	Key    string
	Msg    string
}

// Error renders `config: llmlb.yaml: line 12: routing.afinity: unknown key`.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Source != "" {
		b.WriteString(e.Source)
		b.WriteString(": ")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads and parses a YAML configuration file (see Parse). Errors from a
// Load need not be wrapped again: they name the file.
func Load(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("config: reading %s: %w", path, err)
	}
	if len(data) > maxFileBytes {
		return Config{}, fmt.Errorf("config: %s: larger than %d bytes", path, maxFileBytes)
	}
	return Parse(data, path)
}

// Parse decodes YAML configuration data on top of Default(): keys present
// override the defaults, lists replace them. source names the data in errors
// (usually the file name). Every problem is reported, joined (errors.Join),
// each an *Error naming its key and line: unknown keys (with a suggestion),
// wrong types, bad durations and sizes, unset environment variables. Parse
// does not call Validate. On decode errors the configuration read so far is
// returned with them (keys in error keep their defaults); on a YAML syntax
// error it is the zero Config.
func Parse(data []byte, source string) (Config, error) {
	return parse(data, source, os.LookupEnv)
}

func parse(data []byte, source string, lookupEnv func(string) (string, bool)) (Config, error) {
	cfg := Default()
	d := &decoder{source: source, lookupEnv: lookupEnv}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, nil // empty file: all defaults
		}
		return Config{}, d.syntax(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return Config{}, d.syntax(err)
		}
		return Config{}, &Error{Source: source, Line: extra.Line, Msg: "more than one YAML document (---); a configuration is one document"}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return cfg, nil
		}
		doc = doc.Content[0]
	}
	if doc = resolve(doc); isNull(doc) {
		return cfg, nil
	}
	d.value(doc, reflect.ValueOf(&cfg).Elem(), "")
	// Other routers' names (cache_aware, round_robin, ...) mean the same
	// in routing.policy as they do in --policy.
	cfg.Routing.Policy = policy.Resolve(cfg.Routing.Policy)
	for i := range cfg.Replicas {
		if cfg.Replicas[i].Name == "" {
			cfg.Replicas[i].Name = defaultName(cfg.Replicas[i].URL)
		}
	}
	if len(d.errs) > 0 {
		// In file order, whichever pass found them. The partly decoded
		// configuration comes back too, so `llmlb validate` can also check
		// what was read and explain every error at once.
		slices.SortStableFunc(d.errs[:min(len(d.errs), maxErrors)], func(a, b error) int {
			return cmp.Compare(lineOf(a), lineOf(b))
		})
		return cfg, errors.Join(d.errs...)
	}
	return cfg, nil
}

func lineOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Line
	}
	return 0
}

// defaultName is a replica's name when none is given: the URL's host:port.
func defaultName(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || !utf8.ValidString(u.Host) {
		return ""
	}
	return u.Host
}

// decoder fills Go values from yaml.Nodes, collecting every error.
type decoder struct {
	source    string
	lookupEnv func(string) (string, bool)
	errs      []error

	// Aliases make a YAML graph out of a tree: steps bounds the work (a
	// "billion laughs" file) and depth the recursion (a self-merge).
	steps, depth int
	tooBig       bool
}

const (
	maxSteps = 20_000
	maxDepth = 32
)

// enter counts one node visit; false means stop descending.
func (d *decoder) enter(n *yaml.Node, path string) bool {
	d.steps++
	d.depth++
	if d.steps <= maxSteps && d.depth <= maxDepth {
		return true
	}
	if !d.tooBig {
		d.tooBig = true
		d.fail(n, path, "nested too deeply, or aliases (*name) refer to themselves or expand too much")
	}
	return false
}

// maxErrors bounds the report; beyond it the file is likely not a config.
const maxErrors = 100

func (d *decoder) fail(n *yaml.Node, key, format string, args ...any) {
	if len(d.errs) >= maxErrors {
		if len(d.errs) == maxErrors {
			d.errs = append(d.errs, &Error{Source: d.source, Msg: "too many errors; fix these first"})
		}
		return
	}
	e := &Error{Source: d.source, Key: key, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
	}
	d.errs = append(d.errs, e)
}

// syntax turns a YAML syntax error ("yaml: line 3: ...") into an *Error.
func (d *decoder) syntax(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, tail
			}
		}
	}
	return &Error{Source: d.source, Line: line, Msg: "invalid YAML: " + msg}
}

// resolve follows aliases (*anchor) to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// kindName describes a node for "expected X, got Y" messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!str":
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "an unsupported YAML node"
}

// value decodes n into v; path is v's dotted key path.
func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	defer func() { d.depth-- }()
	if !d.enter(n, path) {
		return
	}
	n = resolve(n)
	if n == nil || n.Kind == yaml.AliasNode {
		d.fail(n, path, "unresolvable alias")
		return
	}
	t := v.Type()
	switch {
	case t.Kind() == reflect.Struct:
		if isNull(n) {
			return // "routing:" with nothing under it keeps the defaults
		}
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping of keys, got %s", kindName(n))
			return
		}
		d.mapping(n, v, path)
	case t.Kind() == reflect.Slice:
		d.list(n, v, path)
	default:
		d.scalar(n, v, path)
	}
}

// mapping decodes a YAML mapping into struct v, rejecting unknown and
// repeated keys. "<<" merge keys are applied first, so explicit keys win.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	fields := fieldsOf(v.Type())
	byKey := make(map[string]field, len(fields))
	names := make([]string, 0, len(fields)+1)
	for _, f := range fields {
		byKey[f.key] = f
		names = append(names, f.key)
	}
	env := envKeys[v.Type()]
	for k := range env {
		names = append(names, k)
	}
	seen := make(map[string]int)
	envSet := make(map[string]*yaml.Node) // env key -> its value node
	fieldSet := make(map[string]bool)     // field key -> present
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Tag == "!!merge" {
			d.merge(vn, v, path)
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Tag == "!!merge" {
			continue
		}
		if kn.Kind != yaml.ScalarNode {
			d.fail(kn, path, "keys must be plain words, got %s", kindName(kn))
			continue
		}
		key := kn.Value
		kpath := join(path, key)
		if first, dup := seen[key]; dup {
			d.fail(kn, kpath, "repeated key (first at line %d)", first)
			continue
		}
		seen[key] = kn.Line
		if path == "" && strings.HasPrefix(key, "x-") {
			continue // extension field: a home for &anchors, as in docker compose
		}
		if _, ok := env[key]; ok {
			envSet[key] = vn
			continue
		}
		f, ok := byKey[key]
		if !ok {
			d.fail(kn, kpath, "unknown key%s", d.hint(key, names, path))
			continue
		}
		fieldSet[key] = true
		d.value(vn, v.FieldByIndex(f.index), kpath)
	}
	for envKey, vn := range envSet {
		fieldName := env[envKey]
		sf, _ := v.Type().FieldByName(fieldName)
		plainKey := snake(sf.Name)
		if fieldSet[plainKey] {
			d.fail(vn, join(path, envKey), "set either %s or %s, not both", plainKey, envKey)
			continue
		}
		d.env(vn, v.FieldByName(fieldName), join(path, envKey))
	}
}

// merge applies a "<<: *anchor" (or a list of them) to struct v.
func (d *decoder) merge(n *yaml.Node, v reflect.Value, path string) {
	defer func() { d.depth-- }()
	if !d.enter(n, path) {
		return
	}
	n = resolve(n)
	switch {
	case n != nil && n.Kind == yaml.MappingNode:
		d.mapping(n, v, path)
	case n != nil && n.Kind == yaml.SequenceNode:
		for _, m := range n.Content {
			if m = resolve(m); m != nil && m.Kind == yaml.MappingNode {
				d.mapping(m, v, path)
			} else {
				d.fail(m, join(path, "<<"), "merge needs a mapping")
			}
		}
	default:
		d.fail(n, join(path, "<<"), "merge needs a mapping")
	}
}

// hint suggests the likely intended key: a close sibling, or the same key
// at another place ("session_ttl" at the top -> routing.affinity.session_ttl).
func (d *decoder) hint(key string, siblings []string, path string) string {
	if s := keyname.Suggest(key, siblings); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	var elsewhere []string
	for _, k := range Keys() {
		if k == key || strings.HasSuffix(k, "."+key) {
			elsewhere = append(elsewhere, k)
		}
	}
	if len(elsewhere) > 0 {
		return fmt.Sprintf(" (did you mean %q?)", strings.Join(elsewhere, `" or "`))
	}
	if path == "" {
		return fmt.Sprintf(" (known keys: %s)", strings.Join(siblings, ", "))
	}
	return ""
}

// env reads the secret named by an *_env key into field v.
func (d *decoder) env(n *yaml.Node, v reflect.Value, path string) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || isNull(n) || n.Value == "" {
		d.fail(n, path, "expected the name of an environment variable")
		return
	}
	val, ok := d.lookupEnv(n.Value)
	switch {
	case !ok:
		d.fail(n, path, "environment variable %s is not set", n.Value)
	case val == "":
		d.fail(n, path, "environment variable %s is empty", n.Value)
	default:
		v.SetString(val)
	}
}

// list decodes a YAML sequence into slice v (replacing the default).
func (d *decoder) list(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "expected a list, got %s", kindName(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		item = resolve(item)
		if v.Type().Elem() == replicaType && item != nil && item.Kind == yaml.ScalarNode && !isNull(item) {
			// Shorthand: "- http://host:8000" or "- name=http://host:8000".
			r, err := parseReplicaFlag(item.Value)
			if err != nil {
				d.fail(item, ipath, "%v", err)
				continue
			}
			out.Index(i).Set(reflect.ValueOf(r))
			continue
		}
		if item != nil && isNull(item) {
			d.fail(item, ipath, "empty list item")
			continue
		}
		d.value(item, out.Index(i), ipath)
	}
	v.Set(out)
}

// scalar decodes a YAML scalar into v, checking its YAML type.
func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "expected a single value, got %s", kindName(n))
		return
	}
	if isNull(n) {
		d.fail(n, path, "no value given")
		return
	}
	t := v.Type()
	switch {
	case t == durationType:
		dur, err := parseDuration(n)
		if err != nil {
			d.fail(n, path, "%v", err)
			return
		}
		v.SetInt(int64(dur))
	case t.Kind() == reflect.String:
		v.SetString(n.Value)
	case t.Kind() == reflect.Bool:
		if n.Tag != "!!bool" {
			d.fail(n, path, "expected true or false, got %s", kindName(n))
			return
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			d.fail(n, path, "expected true or false, got %s", kindName(n))
			return
		}
		v.SetBool(b)
	case isBytes(lastKey(path), t):
		size, err := parseSize(n)
		if err != nil {
			d.fail(n, path, "%v", err)
			return
		}
		v.SetInt(size)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		var i int64
		if n.Tag != "!!int" || n.Decode(&i) != nil {
			d.fail(n, path, "expected an integer, got %s", kindName(n))
			return
		}
		if v.OverflowInt(i) {
			d.fail(n, path, "%s is out of range", n.Value)
			return
		}
		v.SetInt(i)
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		var u uint64
		if n.Tag != "!!int" || n.Decode(&u) != nil {
			d.fail(n, path, "expected a non-negative integer, got %s", kindName(n))
			return
		}
		if v.OverflowUint(u) {
			d.fail(n, path, "%s is out of range", n.Value)
			return
		}
		v.SetUint(u)
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		var f float64
		if (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&f) != nil {
			d.fail(n, path, "expected a number, got %s", kindName(n))
			return
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			d.fail(n, path, "expected a finite number, got %s", n.Value)
			return
		}
		v.SetFloat(f)
	default:
		d.fail(n, path, "unsupported field type %s", t)
	}
}

func lastKey(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// parseDuration accepts Go duration strings ("90s", "5m", "1h30m"); a bare
// number is rejected because its unit would be a guess.
func parseDuration(n *yaml.Node) (time.Duration, error) {
	if n.Tag == "!!int" || n.Tag == "!!float" {
		if n.Value == "0" {
			return 0, nil
		}
		return 0, fmt.Errorf("%s has no unit: write a duration such as \"%ss\" or \"%sms\"", n.Value, n.Value, n.Value)
	}
	if n.Tag != "!!str" {
		return 0, fmt.Errorf("expected a duration such as \"90s\", got %s", kindName(n))
	}
	dur, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (write e.g. \"500ms\", \"90s\", \"5m\", \"1h\")", n.Value)
	}
	return dur, nil
}

// sizeUnits are the suffixes a *_bytes key accepts.
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// parseSize accepts a byte count as an integer or with a unit ("4MiB").
func parseSize(n *yaml.Node) (int64, error) {
	if n.Tag == "!!int" {
		var i int64
		if err := n.Decode(&i); err != nil {
			return 0, fmt.Errorf("expected a byte size, got %s", kindName(n))
		}
		return i, nil
	}
	s := strings.TrimSpace(n.Value)
	for _, u := range sizeUnits {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(f) || f < 0 || f*float64(u.mult) > math.MaxInt64/2 {
			break
		}
		return int64(f * float64(u.mult)), nil
	}
	units := make([]string, 0, len(sizeUnits))
	for _, u := range sizeUnits {
		units = append(units, u.suffix)
	}
	slices.Sort(units)
	return 0, fmt.Errorf("%s is not a byte size (write e.g. 4194304 or \"4MiB\"; units %s)", kindName(n), strings.Join(units, ", "))
}
