package policy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/keyname"
)

// Settings are the tunable policies' parameters, one section per policy:
// routing.cost.*, routing.prefix_tree.*, routing.llmd.* and, for llmlb and
// llmlb-warm, routing.affinity.* (the YAML keys are the field names in
// snake_case). The zero value is not valid: start from DefaultSettings.
type Settings struct {
	Cost       CostConfig
	PrefixTree PrefixTreeConfig
	LLMD       LLMDConfig
	Affinity   AffinityConfig
}

// DefaultSettings returns every policy's defaults.
func DefaultSettings() Settings {
	return Settings{PrefixTree: DefaultPrefixTreeConfig(), Cost: DefaultCostConfig(), LLMD: DefaultLLMDConfig(),
		Affinity: DefaultAffinityConfig()}
}

// WithDefaults fills the sections a caller left at their zero value (a
// configuration built by hand rather than from DefaultSettings).
func (s Settings) WithDefaults() Settings {
	if s.Cost == (CostConfig{}) {
		s.Cost = DefaultCostConfig()
	}
	if s.PrefixTree == (PrefixTreeConfig{}) {
		s.PrefixTree = DefaultPrefixTreeConfig()
	}
	if s.LLMD == (LLMDConfig{}) {
		s.LLMD = DefaultLLMDConfig()
	}
	if s.Affinity == (AffinityConfig{}) {
		s.Affinity = DefaultAffinityConfig()
	}
	return s
}

// Validate reports every bad value of every section, each error naming its
// key relative to the routing section.
func (s Settings) Validate() error {
	return errors.Join(s.Cost.Validate(), s.PrefixTree.Validate(), s.LLMD.Validate(), s.Affinity.Validate())
}

// aliases are short parameter names accepted beside the snake_case field
// names (shorter spellings of SGLang's command-line flags).
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
	if len(params) == 0 {
		return nil
	}
	f, ok := Lookup(name)
	if !ok {
		return ErrUnknown(name)
	}
	if f.Section == nil {
		return fmt.Errorf("policy %s takes no parameters", name)
	}
	target := f.Section(s)
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
	return target.Validate()
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
