package request

import "encoding/json"

// topLevelSystem reads a system prompt given outside "messages": the
// Anthropic Messages API's "system" (string or text blocks) or the
// Responses API's "instructions". Both pass through the proxy.
func topLevelSystem(fields map[string]json.RawMessage) (string, error) {
	for _, name := range []string{"system", "instructions"} {
		raw := fields[name]
		if isNull(raw) {
			continue
		}
		var content any
		err := json.Unmarshal(raw, &content)
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
