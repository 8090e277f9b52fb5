package hftok

import (
	"regexp"
	"strings"
)

// dropAdjacentTrim works around a whitespace bug in ardanlabs/jinja v1.8.0:
// a left-trimming tag ({{-, {%-, {#-) that directly follows another tag
// trims the text before that other tag ("A: {{ x }}{%- endif %}" renders
// "A:x"). In Jinja2 the trim is a no-op there (no text lies between the two
// tags), so dropping its "-" keeps Jinja2's meaning and avoids the bug.
// The scan skips string literals inside tags and {% raw %} blocks.
func dropAdjacentTrim(src string) string {
	return walkTags(src, func(opener, body string, adjacent bool) string {
		if adjacent && strings.HasPrefix(body, "-") {
			return body[1:] // drop the no-op trim
		}
		return body
	})
}

// walkTags copies src with each tag's body (what follows its opener, its
// closer included) replaced by rewrite's: opener is "{{", "{%" or "{#",
// adjacent says whether the tag directly follows another. String literals
// inside tags and {% raw %} blocks are skipped (a raw block's tags are
// copied as they are).
func walkTags(src string, rewrite func(opener, body string, adjacent bool) string) string {
	var b strings.Builder
	b.Grow(len(src) + 64)
	prevEnd := -1 // index just past the previous tag's closer
	i := 0
	for i < len(src) {
		j := nextOpener(src, i)
		if j < 0 {
			b.WriteString(src[i:])
			break
		}
		b.WriteString(src[i:j])
		opener := src[j : j+2]
		end := tagEnd(src, j+2, opener)
		body := src[j+2 : end]
		b.WriteString(opener)
		if opener == "{%" && isRawTag(strings.TrimPrefix(body, "-")) {
			// Copy a raw block verbatim up to and including its endraw.
			b.WriteString(rewrite(opener, body, j == prevEnd))
			loc := endRaw.FindStringIndex(src[end:])
			if loc == nil {
				b.WriteString(src[end:])
				break
			}
			b.WriteString(src[end : end+loc[1]])
			end += loc[1]
		} else {
			b.WriteString(rewrite(opener, body, j == prevEnd))
		}
		prevEnd = end
		i = end
	}
	return b.String()
}

var (
	rawTag = regexp.MustCompile(`^-?\s*raw\s*-?%}$`)
	endRaw = regexp.MustCompile(`{%-?\s*endraw\s*-?%}`)
)

func isRawTag(body string) bool { return rawTag.MatchString(body) }

// nextOpener returns the index of the next "{{", "{%" or "{#" at or after i.
func nextOpener(s string, i int) int {
	for {
		j := strings.IndexByte(s[i:], '{')
		if j < 0 || i+j+1 >= len(s) {
			return -1
		}
		j += i
		if c := s[j+1]; c == '{' || c == '%' || c == '#' {
			return j
		}
		i = j + 1
	}
}

// tagEnd returns the index just past the closer of a tag whose body starts
// at k, skipping string literals in expressions; len(s) if unclosed.
func tagEnd(s string, k int, opener string) int {
	closer := map[string]string{"{{": "}}", "{%": "%}", "{#": "#}"}[opener]
	if opener == "{#" {
		if e := strings.Index(s[k:], closer); e >= 0 {
			return k + e + 2
		}
		return len(s)
	}
	for p := k; p < len(s); p++ {
		switch c := s[p]; c {
		case '\'', '"':
			for p++; p < len(s) && s[p] != c; p++ {
				if s[p] == '\\' {
					p++
				}
			}
		default:
			if strings.HasPrefix(s[p:], closer) {
				return p + 2
			}
		}
	}
	return len(s)
}

// renameTojson renames the tojson filter in src's expressions and
// statements to tojsonFilter, which the renderer defines as Python's
// json.dumps (pyTojson): the template engine looks its own filters up
// first, and its tojson writes floats as Go does (1 for 1.0) and indented
// output with sorted keys, where transformers' keeps the keys' order. The
// scan skips string literals, comments and {% raw %} blocks.
func renameTojson(src string) string {
	return walkTags(src, func(opener, body string, _ bool) string {
		if opener == "{#" || (opener == "{%" && isRawTag(strings.TrimPrefix(body, "-"))) {
			return body
		}
		return renameFilterIn(body, "tojson", tojsonFilter)
	})
}

// renameFilterIn renames filter from to to in a tag's text: a name that
// follows a "|" (spaces between allowed) outside string literals.
func renameFilterIn(tag, from, to string) string {
	if !strings.Contains(tag, from) {
		return tag
	}
	var b strings.Builder
	for p := 0; p < len(tag); p++ {
		c := tag[p]
		switch c {
		case '\'', '"':
			q := p
			for p++; p < len(tag) && tag[p] != c; p++ {
				if tag[p] == '\\' {
					p++
				}
			}
			b.WriteString(tag[q:min(p+1, len(tag))])
			continue
		case '|':
			b.WriteByte(c)
			k := p + 1
			for k < len(tag) && (tag[k] == ' ' || tag[k] == '\t' || tag[k] == '\n') {
				k++
			}
			if strings.HasPrefix(tag[k:], from) && (k+len(from) == len(tag) || !isIdentByte(tag[k+len(from)])) {
				b.WriteString(tag[p+1 : k])
				b.WriteString(to)
				p = k + len(from) - 1
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
