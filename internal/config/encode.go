package config

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Marshal renders c as YAML in the file format, every key present
// (`llmlb validate --print` shows the effective configuration with it).
// Secrets are written as they are: marshal c.Redacted() to print one.
// Parse(Marshal(c)) == c for every configuration Parse can produce.
func Marshal(c Config) ([]byte, error) {
	n := encode(reflect.ValueOf(c), "")
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return buf.Bytes(), nil
}

func encode(v reflect.Value, key string) *yaml.Node {
	t := v.Type()
	switch {
	case t == durationType:
		return str(formatDuration(time.Duration(v.Int())))
	case t.Kind() == reflect.Struct:
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, f := range fieldsOf(t) {
			m.Content = append(m.Content, str(f.key), encode(v.FieldByIndex(f.index), f.key))
		}
		return m
	case t.Kind() == reflect.Slice:
		s := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if k := t.Elem().Kind(); k == reflect.String || k == reflect.Int {
			s.Style = yaml.FlowStyle
		}
		for i := range v.Len() {
			s.Content = append(s.Content, encode(v.Index(i), key))
		}
		return s
	case t.Kind() == reflect.String:
		return str(v.String())
	case t.Kind() == reflect.Bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v.Bool())}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		if s, ok := formatSize(v.Int()); ok && isBytes(key, t) {
			return str(s)
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v.Int(), 10)}
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(v.Uint(), 10)}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		if f := v.Float(); f == math.Trunc(f) && math.Abs(f) < 1e15 {
			// "1", not "!!float 1": an integer reads back as a float.
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatFloat(f, 'f', -1, 64)}
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(v.Float(), 'g', -1, 64)}
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

// str is a string scalar; yaml.v3 quotes it when it would read as another type.
func str(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

// formatDuration writes "1h", "5m", "90s" rather than "1h0m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatSize writes n as "4MiB" when that is exact.
func formatSize(n int64) (string, bool) {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n > 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix, true
		}
	}
	return "", false
}
