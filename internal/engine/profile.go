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

	// Step time = StepBase + StepPerSeq*running sequences + StepPerToken*batched tokens.
	StepBase     time.Duration
	StepPerSeq   time.Duration
	StepPerToken time.Duration
}

// ErrUnknownProfile is returned by Lookup for a name that is not built in.
var ErrUnknownProfile = errors.New("engine: unknown profile")

// builtins are the built-in profiles, the default first. The numbers and
// their sources are in docs/SIMULATOR.md; TestProfileCalibration checks the
// default against SPEC s11's figures.
var builtins = []Profile{
	{
		// SPEC s9/s11: 2x RTX 3090, tensor parallel 2 (the seeds' deployment).
		Name:                DefaultProfile,
		MaxNumSeqs:          64,
		MaxNumBatchedTokens: 2048, // vLLM's API-server default on <70 GiB GPUs
		KVCacheTokens:       300_000,
		MaxModelLen:         131_072,
		StepBase:            21 * time.Millisecond,
		StepPerSeq:          500 * time.Microsecond,
		StepPerToken:        41 * time.Microsecond,
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

// DefaultProfile is the seeds' deployment (SPEC s9, s11).
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
	case p.Blocks() < 1:
		return fmt.Errorf("engine: profile %q: KVCacheTokens must be >= %d, got %d", p.Name, tokenize.BlockSize, p.KVCacheTokens)
	case p.MaxModelLen < 2:
		return fmt.Errorf("engine: profile %q: MaxModelLen must be >= 2, got %d", p.Name, p.MaxModelLen)
	case p.StepBase < 0 || p.StepPerSeq < 0 || p.StepPerToken < 0:
		return fmt.Errorf("engine: profile %q: step times must not be negative", p.Name)
	case p.StepBase+p.StepPerSeq+p.StepPerToken <= 0:
		return fmt.Errorf("engine: profile %q: a step must take some time", p.Name)
	}
	return nil
}
