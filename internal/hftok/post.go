package hftok

import (
	"encoding/json"
	"fmt"
)

// postProcessor is what tokenizers' post-processor adds around a single
// sequence when add_special_tokens is true: ids before and after it.
type postProcessor struct {
	prefix, suffix []uint32
	// err is set for a post-processor this package does not reproduce;
	// EncodeWithSpecialTokens returns it (Encode does not need it).
	err error
}

// loadPostProcessor reads null, ByteLevel (adds nothing), TemplateProcessing
// (its "single" template) and a Sequence of those.
func loadPostProcessor(m json.RawMessage) postProcessor {
	var p postProcessor
	if isNull(m) {
		return p
	}
	if err := p.add(m); err != nil {
		return postProcessor{err: err}
	}
	return p
}

func (p *postProcessor) add(m json.RawMessage) error {
	var pp struct {
		Type          string            `json:"type"`
		Processors    []json.RawMessage `json:"processors"`
		Single        []json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(m, &pp); err != nil {
		return fmt.Errorf("hftok: post_processor: %w", err)
	}
	switch pp.Type {
	case "ByteLevel":
		return nil // offsets only
	case "Sequence":
		for _, sub := range pp.Processors {
			if err := p.add(sub); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		if len(p.prefix) > 0 || len(p.suffix) > 0 {
			return fmt.Errorf("hftok: post_processor has two TemplateProcessing steps; not supported")
		}
		seen := false
		for _, piece := range pp.Single {
			var pc struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(piece, &pc); err != nil {
				return fmt.Errorf("hftok: post_processor template: %w", err)
			}
			switch {
			case pc.Sequence != nil:
				if seen || pc.Sequence.ID != "A" {
					return fmt.Errorf("hftok: post_processor single template with sequence %q; not supported", pc.Sequence.ID)
				}
				seen = true
			case pc.SpecialToken != nil:
				st, ok := pp.SpecialTokens[pc.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("hftok: post_processor template uses %q, not in its special_tokens", pc.SpecialToken.ID)
				}
				if seen {
					p.suffix = append(p.suffix, st.IDs...)
				} else {
					p.prefix = append(p.prefix, st.IDs...)
				}
			default:
				return fmt.Errorf("hftok: post_processor template piece %s not understood", piece)
			}
		}
		if !seen {
			return fmt.Errorf("hftok: post_processor single template has no sequence")
		}
		return nil
	}
	return fmt.Errorf("hftok: post_processor %q not supported for add_special_tokens", pp.Type)
}

// EncodeWithSpecialTokens returns the ids Hugging Face's encode gives with
// add_special_tokens=True (what vLLM does for a completions prompt): Encode's
// ids wrapped by the post-processor's single-sequence template, such as
// Llama 3's leading <|begin_of_text|>. A post-processor other than null,
// ByteLevel, TemplateProcessing or a Sequence of them is an error here.
func (t *Tokenizer) EncodeWithSpecialTokens(text string) ([]uint32, error) {
	if t.post.err != nil {
		return nil, t.post.err
	}
	ids := append([]uint32(nil), t.post.prefix...)
	ids, err := t.AppendEncode(ids, text)
	if err != nil {
		return nil, err
	}
	return append(ids, t.post.suffix...), nil
}
