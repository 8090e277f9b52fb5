package simreplica

import "encoding/json"

// maxSchemaDepth bounds how deep toolArguments follows nested objects: a
// client's schema must not make the replica recurse without end.
const maxSchemaDepth = 8

// toolArguments returns the arguments of a forced call of a function whose
// parameters are the JSON Schema schema, as a JSON object: every required
// property with a placeholder of its type (its const, first enum value or
// default, else "sim", its minimum or 0, false, [] or an object filled the
// same way), so that a client that checks the call against its schema
// accepts it. A missing or unreadable schema, or one that is not an object,
// gives "{}".
func toolArguments(schema json.RawMessage) string {
	v, ok := placeholder(schema, 0).(map[string]any)
	if !ok {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// jsonSchema is the part of a JSON Schema placeholder reads.
type jsonSchema struct {
	Type       json.RawMessage            `json:"type"`
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
	Enum       []any                      `json:"enum"`
	Const      json.RawMessage            `json:"const"`
	Default    json.RawMessage            `json:"default"`
	Minimum    *float64                   `json:"minimum"`
}

// placeholder returns a value that schema accepts, as far as its type,
// const, enum, default, minimum and required properties say.
func placeholder(raw json.RawMessage, depth int) any {
	var s jsonSchema
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		if depth == 0 {
			return map[string]any{}
		}
		return "sim"
	}
	for _, fixed := range []json.RawMessage{s.Const, s.Default} {
		var v any
		if len(fixed) > 0 && json.Unmarshal(fixed, &v) == nil {
			return v
		}
	}
	if len(s.Enum) > 0 {
		return s.Enum[0]
	}
	switch schemaType(s) {
	case "object":
		obj := map[string]any{}
		if depth >= maxSchemaDepth {
			return obj
		}
		for _, name := range s.Required {
			obj[name] = placeholder(s.Properties[name], depth+1)
		}
		return obj
	case "array":
		return []any{}
	case "integer", "number":
		if s.Minimum != nil {
			return *s.Minimum
		}
		return 0
	case "boolean":
		return false
	case "null":
		return nil
	}
	return "sim"
}

// schemaType is the schema's type: its type keyword (the first one not
// "null" of a list), else "object" when it has properties, else "".
func schemaType(s jsonSchema) string {
	var one string
	if json.Unmarshal(s.Type, &one) == nil && one != "" {
		return one
	}
	var many []string
	if json.Unmarshal(s.Type, &many) == nil {
		for _, t := range many {
			if t != "null" {
				return t
			}
		}
		if len(many) > 0 {
			return "null"
		}
	}
	if s.Properties != nil || s.Required != nil {
		return "object"
	}
	return ""
}
