package request

import (
	"encoding/json"
	"strings"

	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// parsePrompt reads a completions "prompt" or embeddings "input": a string,
// an array of strings (joined by newlines), or token ids (an array of
// integers or of such arrays; their compact JSON text stands for the
// prompt). It returns the text and the estimated tokens (the count of ids
// for token arrays). Token ids are counted in one pass over the bytes,
// never decoded into a slice, and only the first MaxPromptBlockBytes of
// their text are kept: 15M ids in a 30 MB body cost no 120 MB slice.
func parsePrompt(fields map[string]json.RawMessage, name string) (text string, tokens int, err error) {
	raw := fields[name]
	if isNull(raw) {
		return "", 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, tokenize.CountText(s), nil
		}
	case '[':
		if first := jsontop.SkipSpace(raw, 1); first < len(raw) && raw[first] == '"' {
			var strs []string
			if json.Unmarshal(raw, &strs) == nil {
				s := strings.Join(strs, "\n")
				return s, tokenize.CountText(s), nil
			}
			break
		}
		if n, ok := countTokenIDs(raw); ok {
			return compactPrefix(raw, MaxPromptBlockBytes), n, nil
		}
	}
	return "", 0, badf(nil, "%q must be a string, an array of strings or an array of token ids", name)
}

// countTokenIDs counts the integers of a valid JSON array of integers, or
// of arrays of integers; ok is false for anything else.
func countTokenIDs(raw []byte) (n int, ok bool) {
	depth, idDepth, inNumber := 0, 0, false
	for _, c := range raw {
		switch {
		case c == '[':
			depth++
			if depth > 2 {
				return 0, false
			}
		case c == ']':
			depth--
			inNumber = false
		case c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n':
			inNumber = false
		case c >= '0' && c <= '9' || c == '-':
			if !inNumber {
				// Numbers sit at one depth only: [1,2] or [[1,2],[3]],
				// never [1,[2]] or [[1],2].
				if idDepth == 0 {
					idDepth = depth
				} else if depth != idDepth {
					return 0, false
				}
				n++
				inNumber = true
			}
		default: // fractions, exponents, strings, objects, literals
			return 0, false
		}
	}
	return n, true
}

// compactPrefix is the compact JSON text of a valid array of numbers (its
// whitespace dropped), at most limit bytes of it.
func compactPrefix(raw []byte, limit int) string {
	out := make([]byte, 0, min(len(raw), limit))
	for _, c := range raw {
		if len(out) == limit {
			break
		}
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			out = append(out, c)
		}
	}
	return string(out)
}
