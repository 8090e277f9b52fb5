package config

import (
	"reflect"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/keyname"
	"github.com/llmlb/llmlb/internal/sharedstate"
)

// The YAML keys are derived from the Go field names (SessionTTL ->
// session_ttl, APIKey -> api_key), so a field a colleague adds to
// balancer.Config, health.Config or request.Config becomes a key without a
// change here; TestDocsListEveryKey keeps docs/CONFIG.md in step.

var (
	durationType = reflect.TypeFor[time.Duration]()
	configType   = reflect.TypeFor[Config]()
	replicaType  = reflect.TypeFor[Replica]()
	discoType    = reflect.TypeFor[discovery.Config]()
	gpustackType = reflect.TypeFor[discovery.GPUStackConfig]()
	stateType    = reflect.TypeFor[sharedstate.Config]()
)

// envKeys are the keys that name an environment variable holding a secret
// field instead of the secret itself (never write secrets into the file).
var envKeys = map[reflect.Type]map[string]string{
	configType:   {"admin_token_env": "AdminToken"},
	replicaType:  {"api_key_env": "APIKey"},
	discoType:    {"api_key_env": "APIKey"},
	gpustackType: {"api_key_env": "APIKey"},
	stateType:    {"redis_url_env": "RedisURL"}, // the URL may hold a password
}

// field is one YAML key of a struct.
type field struct {
	key   string
	index []int // for reflect.Value.FieldByIndex
	typ   reflect.Type
}

// fieldsOf lists the keys of struct type t, in declaration order. The
// fields of an embedded struct are the embedding struct's own keys, as Go
// promotes them (balancer.Config embeds policy.Settings: routing.cost).
func fieldsOf(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for _, sub := range fieldsOf(f.Type) {
				sub.index = append([]int{i}, sub.index...)
				out = append(out, sub)
			}
			continue
		}
		if !f.IsExported() || !supported(f.Type) {
			continue
		}
		out = append(out, field{key: snake(f.Name), index: []int{i}, typ: f.Type})
	}
	return out
}

// supported reports whether the decoder can fill a value of type t.
func supported(t reflect.Type) bool {
	if t == durationType {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	case reflect.Struct:
		return true
	case reflect.Slice:
		e := t.Elem()
		return e.Kind() == reflect.String || e.Kind() == reflect.Struct || e.Kind() == reflect.Int
	}
	return false
}

// isBytes reports whether a field holds a byte size ("4MiB" accepted).
func isBytes(key string, t reflect.Type) bool {
	return strings.HasSuffix(key, "_bytes") && t.Kind() == reflect.Int64
}

// snake is the YAML key of a Go field name (package keyname).
func snake(name string) string { return keyname.Snake(name) }

// Keys lists every configuration key as a dotted path, list items written
// as "replicas[].url", in declaration order. docs/CONFIG.md documents each.
func Keys() []string {
	return keysOf(configType, "")
}

func keysOf(t reflect.Type, prefix string) []string {
	var out []string
	for _, f := range fieldsOf(t) {
		path := join(prefix, f.key)
		switch {
		case f.typ == durationType:
			out = append(out, path)
		case f.typ.Kind() == reflect.Struct:
			out = append(out, keysOf(f.typ, path)...)
		case f.typ.Kind() == reflect.Slice && f.typ.Elem().Kind() == reflect.Struct:
			out = append(out, keysOf(f.typ.Elem(), path+"[]")...)
		default:
			out = append(out, path)
		}
	}
	for k := range envKeys[t] {
		out = append(out, join(prefix, k))
	}
	return out
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}
