package scrape

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Fake is an in-memory Fetcher, ModelFetcher and LivenessChecker for tests
// (this package's and others'): set a result or an error per replica URL,
// then count the calls. A URL with nothing set fails with an error naming
// it. Safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	results map[string]fakeResult
	models  map[string]fakeModels
	live    map[string]error
	calls   map[string]int
	checks  map[string]int
	keys    map[string]string // last API key seen per URL
}

type fakeResult struct {
	res Result
	err error
}

type fakeModels struct {
	models []string
	err    error
}

// NewFake returns a Fake with no results set.
func NewFake() *Fake {
	return &Fake{
		results: make(map[string]fakeResult),
		models:  make(map[string]fakeModels),
		live:    make(map[string]error),
		calls:   make(map[string]int),
		checks:  make(map[string]int),
		keys:    make(map[string]string),
	}
}

// Set makes the following Fetch calls for url return res, or err when non-nil.
func (f *Fake) Set(url string, res Result, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results[url] = fakeResult{res: res, err: err}
}

// SetModels makes FetchModels for url return models, or err when non-nil.
func (f *Fake) SetModels(url string, models []string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.models[url] = fakeModels{models: slices.Clone(models), err: err}
}

// Fetch returns what Set recorded for url.
func (f *Fake) Fetch(ctx context.Context, url string) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[url]++
	f.keys[url] = apiKeyFrom(ctx)
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("scrape: fake: %w", err)
	}
	r, ok := f.results[url]
	if !ok {
		return Result{}, fmt.Errorf("scrape: fake: no result set for %s", url)
	}
	return r.res, r.err
}

// SetLive makes the following CheckLive calls for url succeed, or fail with
// err when non-nil.
func (f *Fake) SetLive(url string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[url] = err
}

// CheckLive returns what SetLive recorded for url.
func (f *Fake) CheckLive(ctx context.Context, url string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks[url]++
	f.keys[url] = apiKeyFrom(ctx)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("scrape: fake: %w", err)
	}
	err, ok := f.live[url]
	if !ok {
		return fmt.Errorf("scrape: fake: no liveness set for %s", url)
	}
	return err
}

// LiveChecks returns how many times CheckLive was called for url.
func (f *Fake) LiveChecks(url string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checks[url]
}

// FetchModels returns what SetModels recorded for url.
func (f *Fake) FetchModels(ctx context.Context, url string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.models[url]
	if !ok {
		return nil, fmt.Errorf("scrape: fake: no models set for %s", url)
	}
	return slices.Clone(m.models), m.err
}

// Calls returns how many times Fetch was called for url.
func (f *Fake) Calls(url string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[url]
}

// LastAPIKey returns the API key (WithAPIKey) of the last Fetch or
// CheckLive for url.
func (f *Fake) LastAPIKey(url string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keys[url]
}
