package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// errNotFound marks an API version the GPUStack server does not have.
var errNotFound = errors.New("discovery: gpustack: API not found")

// GPUStack discovers replicas from a GPUStack server's model instances:
// every instance in state "running" with a worker address (its advertised
// address, else its IP) and port is a replica
// serving its model's name (GPUStack starts vLLM with the model's name as
// the served model name). It asks API v2 (GPUStack 2.x) first and falls
// back to v1 when the server answers 404 there.
type GPUStack struct {
	cfg    GPUStackConfig
	client *http.Client
	log    *slog.Logger
	v1     atomic.Bool // the server has no v2 API
}

// NewGPUStack returns a GPUStack source; client nil uses a client with cfg.Timeout.
func NewGPUStack(cfg GPUStackConfig, client *http.Client, logger *slog.Logger) *GPUStack {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if client == nil {
		timeout := cfg.Timeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		client = &http.Client{
			Timeout: timeout,
			// The API key must not follow a redirect to another host.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return &GPUStack{cfg: cfg, client: client, log: logger}
}

// gpustackInstance holds the fields of a model instance the source reads.
type gpustackInstance struct {
	ID        int64  `json:"id"`
	Name      string `json:"name"`
	ModelName string `json:"model_name"`
	WorkerIP  string `json:"worker_ip"`
	Advertise string `json:"worker_advertise_address"` // GPUStack 2.x: preferred over worker_ip
	Port      int    `json:"port"`
	Ports     []int  `json:"ports"`
	State     string `json:"state"`
}

type gpustackPage struct {
	Items      []gpustackInstance `json:"items"`
	Pagination struct {
		Page      int `json:"page"`
		TotalPage int `json:"totalPage"`
	} `json:"pagination"`
}

// maxPages bounds one poll (100 instances a page).
const maxPages = 100

// Poll lists the running instances once, sorted by name.
func (g *GPUStack) Poll(ctx context.Context) ([]Target, error) {
	var items []gpustackInstance
	var err error
	if !g.v1.Load() {
		items, err = g.list(ctx, "v2")
		if errors.Is(err, errNotFound) {
			g.log.Info("discovery: gpustack has no v2 API; using v1")
			g.v1.Store(true)
		}
	}
	if g.v1.Load() {
		items, err = g.list(ctx, "v1")
	}
	if err != nil {
		return nil, err
	}
	var out []Target
	for _, in := range items {
		host := in.Advertise
		if host == "" {
			host = in.WorkerIP
		}
		if !strings.EqualFold(in.State, "running") || host == "" {
			continue
		}
		if len(g.cfg.Models) > 0 && !slices.Contains(g.cfg.Models, in.ModelName) {
			continue
		}
		port := in.Port
		if port == 0 && len(in.Ports) > 0 {
			port = in.Ports[0]
		}
		if port <= 0 || port > 65535 {
			continue
		}
		var models []string
		if in.ModelName != "" {
			models = []string{in.ModelName}
		}
		out = append(out, Target{
			Name:   targetName(in.Name, host, port),
			URL:    targetURL(g.cfg.Scheme, host, port),
			Models: models,
		})
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	out = slices.CompactFunc(out, func(a, b Target) bool { return a.Name == b.Name })
	return out, nil
}

// list reads every page of /{version}/model-instances.
func (g *GPUStack) list(ctx context.Context, version string) ([]gpustackInstance, error) {
	var all []gpustackInstance
	for page := 1; page <= maxPages; page++ {
		u := strings.TrimSuffix(g.cfg.URL, "/") + "/" + version + "/model-instances?perPage=100&page=" + strconv.Itoa(page)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, fmt.Errorf("discovery: gpustack: %w", err)
		}
		req.Header.Set("Accept", "application/json")
		if g.cfg.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+g.cfg.APIKey)
		}
		resp, err := g.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("discovery: gpustack: %w", err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("discovery: gpustack: reading %s: %w", version, err)
		}
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return nil, errNotFound
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			return nil, fmt.Errorf("discovery: gpustack: %s model-instances: %s (check discovery.gpustack.api_key)", version, resp.Status)
		case resp.StatusCode != http.StatusOK:
			return nil, fmt.Errorf("discovery: gpustack: %s model-instances: %s", version, resp.Status)
		}
		var p gpustackPage
		if err := json.Unmarshal(body, &p); err != nil {
			return nil, fmt.Errorf("discovery: gpustack: %s model-instances: %w", version, err)
		}
		all = append(all, p.Items...)
		if p.Pagination.TotalPage <= page || len(p.Items) == 0 {
			return all, nil
		}
	}
	return all, nil
}

// Run polls at once and then every interval. A failed poll keeps the last
// set and is logged.
func (g *GPUStack) Run(ctx context.Context, update func([]Target)) error {
	interval := g.cfg.Interval
	if interval <= 0 {
		interval = 15 * time.Second
	}
	return pollEvery(ctx, interval, g.Poll, update, func(err error) {
		g.log.Warn("discovery: gpustack poll failed; keeping the last set", slog.String("error", err.Error()))
	})
}
