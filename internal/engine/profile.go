package engine

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// Profile is one simulated deployment: scheduler limits, KV capacity and the
// step-time model. docs/SIMULATOR.md says where each number comes from.
type Profile struct {
	Name                string
	MaxNumSeqs          int // running slots
	MaxNumBatchedTokens int // per-step token budget (chunked prefill)
	KVCacheTokens       int // KV capacity in tokens (blocks = KVCacheTokens/16)
	MaxModelLen         int // longest prompt+output accepted

	// MaxPartialPrefills is how many requests may be in prefill at once
	// sharing a step's token budget evenly (vLLM's
	// --max-num-partial-prefills, which vLLM v1 refuses: there
	// --long-prefill-token-threshold lets prefills share a step by capping
	// each chunk, docs/SIMULATOR.md). 0 or 1 is vLLM v1's default, serial
	// prefill: the budget goes to requests in admission order, so a long
	// prompt takes whole steps and the prompts behind it wait. Above 1 the
	// prefills share each step, so a short prompt behind a long one is done
	// after a few steps while the long one slows (parallel prefill).
	MaxPartialPrefills int

	// PriorityScheduling orders the waiting queue by each request's
	// Priority, lowest first, then by arrival (vLLM's --scheduling-policy
	// priority; its default, fcfs, is first come, first served whatever
	// the priority). A running request is never stopped for a waiting
	// one of a higher priority: the queue's order decides who takes the
	// next free slot.
	PriorityScheduling bool

	// Step time = StepBase + StepPerSeq*requests in the step
	//   + StepPerToken*batched tokens
	//   + StepPerAttention*(Σ over prefill chunks of n*(c+n/2))/1000
	//   + StepPerContextToken*(Σ over decoding requests of their context),
	// for a chunk of n prompt tokens after c already computed (or cached).
	StepBase     time.Duration
	StepPerSeq   time.Duration
	StepPerToken time.Duration
	// StepPerAttention is the compute of prefill attention per 1,000
	// (query, key) token pairs: what makes a long prompt's later chunks
	// slower than its first ones.
	StepPerAttention time.Duration
	// StepPerContextToken is a decoding request's cost per token of context:
	// its KV bytes read from GPU memory each step.
	StepPerContextToken time.Duration
}

// ErrUnknownProfile is returned by Lookup for a name that is not built in.
var ErrUnknownProfile = errors.New("engine: unknown profile")

// builtins are the built-in profiles, the default first. The numbers and
// their sources are in docs/SIMULATOR.md; TestProfileCalibration checks the
// default against docs/SIMULATOR.md's figures.
var builtins = []Profile{
	{
		// 2x RTX 3090, tensor parallel 2 (the reference deployment, docs/SIMULATOR.md).
		Name:                DefaultProfile,
		MaxNumSeqs:          64,
		MaxNumBatchedTokens: 2048, // vLLM's API-server default on <70 GiB GPUs
		KVCacheTokens:       300_000,
		MaxModelLen:         131_072,
		StepBase:            22 * time.Millisecond,
		StepPerSeq:          500 * time.Microsecond,
		StepPerToken:        12500 * time.Nanosecond,
		StepPerAttention:    410 * time.Nanosecond, // 3.3e-5 x StepPerToken per context token
		StepPerContextToken: 60 * time.Nanosecond,  // 80 KB of KV / (2 x 936 GB/s at ~70%)
	},
	{
		// One H100 80 GB, an 8B model with an FP8 KV cache.
		Name:                "h100",
		MaxNumSeqs:          1024, // vLLM's API-server default on >=70 GiB GPUs
		MaxNumBatchedTokens: 8192, // idem
		KVCacheTokens:       800_000,
		MaxModelLen:         131_072,
		StepBase:            7 * time.Millisecond,
		StepPerSeq:          150 * time.Microsecond,
		StepPerToken:        30 * time.Microsecond,
		StepPerAttention:    990 * time.Nanosecond, // 3.3e-5 x StepPerToken per context token
		StepPerContextToken: 28 * time.Nanosecond,  // 64 KiB of FP8 KV / (3.35 TB/s at ~70%)
	},
}

// Lookup returns a built-in profile by name.
func Lookup(name string) (Profile, error) {
	for _, p := range builtins {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownProfile, name, strings.Join(ProfileNames(), ", "))
}

// ProfileNames lists the built-in profiles, the default first.
func ProfileNames() []string {
	names := make([]string, len(builtins))
	for i, p := range builtins {
		names[i] = p.Name
	}
	return names
}

// DefaultProfile is the reference deployment (docs/SIMULATOR.md).
const DefaultProfile = "2x3090-tp2"

// Blocks is the profile's KV capacity in 16-token blocks.
func (p Profile) Blocks() int { return p.KVCacheTokens / tokenize.BlockSize }

// Validate reports the first field that makes the profile unusable.
func (p Profile) Validate() error {
	switch {
	case p.MaxNumSeqs < 1:
		return fmt.Errorf("engine: profile %q: MaxNumSeqs must be >= 1, got %d", p.Name, p.MaxNumSeqs)
	case p.MaxNumBatchedTokens < 1:
		return fmt.Errorf("engine: profile %q: MaxNumBatchedTokens must be >= 1, got %d", p.Name, p.MaxNumBatchedTokens)
	case p.MaxPartialPrefills < 0:
		return fmt.Errorf("engine: profile %q: MaxPartialPrefills must be >= 0, got %d", p.Name, p.MaxPartialPrefills)
	case p.Blocks() < 1:
		return fmt.Errorf("engine: profile %q: KVCacheTokens must be >= %d, got %d", p.Name, tokenize.BlockSize, p.KVCacheTokens)
	case p.MaxModelLen < 2:
		return fmt.Errorf("engine: profile %q: MaxModelLen must be >= 2, got %d", p.Name, p.MaxModelLen)
	case p.StepBase < 0 || p.StepPerSeq < 0 || p.StepPerToken < 0 || p.StepPerAttention < 0 || p.StepPerContextToken < 0:
		return fmt.Errorf("engine: profile %q: step times must not be negative", p.Name)
	case p.StepBase+p.StepPerSeq+p.StepPerToken <= 0:
		return fmt.Errorf("engine: profile %q: a step must take some time", p.Name)
	}
	return nil
}

// stepTime is the step-time model (no slowdown) for a step with seqs
// requests, tokens batched tokens, halfPairs = Σ n*(2c+n) over its prefill
// chunks and ctx context tokens read by its decoding requests.
func (p *Profile) stepTime(seqs, tokens int, halfPairs, ctx int64) time.Duration {
	return p.StepBase + time.Duration(seqs)*p.StepPerSeq + time.Duration(tokens)*p.StepPerToken +
		time.Duration(int64(p.StepPerAttention)*halfPairs/2000) + time.Duration(ctx)*p.StepPerContextToken
}

// scaled returns the profile with every step-time coefficient multiplied by
// f (a slowdown). Scaling the coefficients rather than each step keeps step
// times linear in the context, which the decode-run fast path relies on.
func (p Profile) scaled(f float64) Profile {
	if f == 1 {
		return p
	}
	s := func(d *time.Duration) { *d = time.Duration(float64(*d) * f) }
	s(&p.StepBase)
	s(&p.StepPerSeq)
	s(&p.StepPerToken)
	s(&p.StepPerAttention)
	s(&p.StepPerContextToken)
	return p
}

// IsolatedTTFT is the time to first token of a lone request with
// promptTokens prompt tokens on an idle engine with an empty cache: its
// prefill in chunks of MaxNumBatchedTokens, the last of which yields the
// first token. It is the denominator of the benchmark's TTFT slowdown.
func (p Profile) IsolatedTTFT(promptTokens int) time.Duration {
	if p.MaxNumBatchedTokens < 1 {
		return 0
	}
	var d time.Duration
	for c := 0; c < promptTokens; {
		n := min(p.MaxNumBatchedTokens, promptTokens-c)
		d += max(p.stepTime(1, n, int64(n)*int64(2*c+n), 0), time.Nanosecond)
		c += n
	}
	return d
}
