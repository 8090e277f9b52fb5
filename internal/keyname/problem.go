package keyname

import "fmt"

// Error is a problem with the value of one configuration key, reported by
// a package that validates its own section of the configuration (proxy,
// discovery). Package config reports it as its own error under Key, so it
// is named, and deduplicated, like every other key's.
type Error struct {
	Key string // dotted path as written in the file: discovery.kubernetes.service, proxy.retry_statuses[1]
	Msg string // what is wrong, without the key
}

// Error renders "key: msg".
func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Errorf returns an *Error for key with a formatted message.
func Errorf(key, format string, args ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Suggest returns the closest of candidates to s, or "" when none is close
// enough to be a likely typo: an unknown key's intended sibling, or the
// intended one of a setting's allowed values.
func Suggest(s string, candidates []string) string {
	maxD := min(max(len(s)/3, 1), 3)
	best, bestD := "", maxD+1
	for _, c := range candidates {
		if d := distance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance (with adjacent transpositions).
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
