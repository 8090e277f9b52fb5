package engine

import "time"

// Profile is one simulated deployment: scheduler limits, KV capacity and the
// step-time model. docs/SIMULATOR.md says where each number comes from.
type Profile struct {
	Name                string
	MaxNumSeqs          int // running slots
	MaxNumBatchedTokens int // per-step token budget (chunked prefill)
	KVCacheTokens       int // KV capacity in tokens (blocks = KVCacheTokens/16)
	MaxModelLen         int // longest prompt+output accepted

	// Step time = StepBase + StepPerSeq*running sequences + StepPerToken*batched tokens.
	StepBase     time.Duration
	StepPerSeq   time.Duration
	StepPerToken time.Duration
}

// Lookup returns a built-in profile by name.
func Lookup(name string) (Profile, error) { panic("engine: Lookup not implemented yet") }

// ProfileNames lists the built-in profiles, the default first.
func ProfileNames() []string { panic("engine: ProfileNames not implemented yet") }

// DefaultProfile is the seeds' deployment (SPEC s9, s11).
const DefaultProfile = "2x3090-tp2"
