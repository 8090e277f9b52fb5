package policy

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/keyname"
)

// Settings are the tunable policies' parameters; the zero value is not
// valid, start from DefaultSettings.
type Settings struct {
	PrefixTree PrefixTreeConfig
	Cost       CostConfig
	LLMD       LLMDConfig
}

// DefaultSettings returns every policy's defaults.
func DefaultSettings() Settings {
	return Settings{PrefixTree: DefaultPrefixTreeConfig(), Cost: DefaultCostConfig(), LLMD: DefaultLLMDConfig()}
}

// aliases are short parameter names accepted beside the snake_case field
// names (the issue tracker's and SGLang's command-line spellings).
var aliases = map[string]string{
	"balance_abs": "balance_abs_threshold",
	"balance_rel": "balance_rel_threshold",
	"eviction":    "eviction_interval",
}

// ParseSpec splits a policy spec, "name" or "name:key=value,key=value", into
// the name and its parameters in order.
func ParseSpec(spec string) (name string, params [][2]string, err error) {
	name, rest, hasParams := strings.Cut(strings.TrimSpace(spec), ":")
	if name == "" {
		return "", nil, fmt.Errorf("policy: empty policy name in %q", spec)
	}
	if !hasParams {
		return name, nil, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return "", nil, fmt.Errorf("policy %s: parameter %q: want key=value", name, kv)
		}
		params = append(params, [2]string{k, v})
	}
	return name, params, nil
}

// SplitSpecs splits a comma-separated list of policy specs. A parameter
// (key=value) belongs to the spec before it, so
// "rr,prefix-tree:cache_threshold=0.5,balance_abs=32,cost" is three specs.
func SplitSpecs(list string) []string {
	var out []string
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if strings.Contains(part, "=") && !strings.Contains(part, ":") && len(out) > 0 {
			out[len(out)-1] += "," + part
			continue
		}
		out = append(out, part)
	}
	return out
}

// Apply sets the named policy's parameters from a spec's key=value list.
// Policies without parameters accept none.
func (s *Settings) Apply(name string, params [][2]string) error {
	var target any
	switch name {
	case NamePrefixTree:
		target = &s.PrefixTree
	case NameCost:
		target = &s.Cost
	case NameLLMD:
		target = &s.LLMD
	}
	if len(params) == 0 {
		return nil
	}
	if target == nil {
		return fmt.Errorf("policy %s takes no parameters", name)
	}
	v := reflect.ValueOf(target).Elem()
	var known []string
	for i := range v.NumField() {
		known = append(known, keyname.Snake(v.Type().Field(i).Name))
	}
	for _, kv := range params {
		key := kv[0]
		if a, ok := aliases[key]; ok {
			key = a
		}
		i := slices.Index(known, key)
		if i < 0 {
			return fmt.Errorf("policy %s: unknown parameter %q (known: %s)", name, kv[0], strings.Join(known, ", "))
		}
		if err := setField(v.Field(i), kv[1]); err != nil {
			return fmt.Errorf("policy %s: %s=%s: %w", name, kv[0], kv[1], err)
		}
	}
	switch t := target.(type) {
	case *PrefixTreeConfig:
		return t.Validate()
	case *CostConfig:
		return t.Validate()
	case *LLMDConfig:
		return t.Validate()
	}
	return nil
}

func setField(f reflect.Value, s string) error {
	if f.Type() == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
		return nil
	}
	switch f.Kind() {
	case reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("not a number")
		}
		f.SetFloat(x)
	case reflect.Int:
		x, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		f.SetInt(int64(x))
	default:
		return fmt.Errorf("unsupported parameter type %s", f.Type())
	}
	return nil
}
