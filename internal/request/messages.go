package request

import (
	"encoding/json"
	"strings"
)

// billingHeader starts the system block Claude Code puts first in every
// request (x-anthropic-billing-header: cc_version=...; cch=...;), whose
// cch changes with every request. vLLM and SGLang drop that block before
// rendering, so that the prompt's prefix stays the same turn after turn;
// llmlb drops it too, or every Claude Code request would look like a new
// prompt to its prefix keys and block index.
const billingHeader = "x-anthropic-billing-header"

// topLevelSystem reads a system prompt given outside "messages": the
// Anthropic Messages API's "system" (string or text blocks, Claude Code's
// billing header block left out) or the Responses API's "instructions".
// Both pass through the proxy.
func topLevelSystem(fields map[string]json.RawMessage) (string, error) {
	for _, name := range []string{"system", "instructions"} {
		raw := fields[name]
		if isNull(raw) {
			continue
		}
		var content any
		err := json.Unmarshal(raw, &content)
		if blocks, ok := content.([]any); ok && name == "system" {
			content = withoutBillingHeader(blocks)
		}
		text := ""
		if err == nil {
			text, err = contentText(content)
		}
		if err != nil {
			return "", badf(err, "%q must be a string or an array of text blocks", name)
		}
		if text != "" {
			return text, nil
		}
	}
	return "", nil
}

// withoutBillingHeader returns blocks without the text blocks that start
// with Claude Code's billing header.
func withoutBillingHeader(blocks []any) []any {
	out := blocks[:0:0]
	for _, b := range blocks {
		if m, ok := b.(map[string]any); ok && m["type"] == "text" {
			if text, _ := m["text"].(string); strings.HasPrefix(text, billingHeader) {
				continue
			}
		}
		out = append(out, b)
	}
	return out
}

// toolUseText is the prompt text of an Anthropic tool_use content block (a
// tool call): its name and input, which the replica renders into the
// prompt.
func toolUseText(block map[string]any) string {
	b, _ := json.Marshal(block["input"])
	name, _ := block["name"].(string)
	return name + string(b)
}

// toolResultText is the prompt text of an Anthropic tool_result content
// block: its content, a string or text blocks. An odd result is no error:
// its text is unknown, so it counts as none.
func toolResultText(block map[string]any) string {
	text, err := contentText(block["content"])
	if err != nil {
		return ""
	}
	return text
}
