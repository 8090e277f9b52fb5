package config

import (
	"errors"
	"fmt"
	"strings"
)

// ApplyFlags lets command-line flags override the file: a
// non-empty listen or adminListen replaces the address, and when replicas is
// non-empty it replaces the file's replica list. Each replica flag is
// "name=URL" or a bare URL (the name is then the URL's host:port). A flag
// replica whose name matches one from the file keeps that replica's api_key,
// models and metrics mode, so `--replica a=http://new:8000` only moves it.
func ApplyFlags(cfg *Config, listen, adminListen string, replicas []string) error {
	if cfg == nil {
		return errors.New("config: ApplyFlags: nil config")
	}
	if listen != "" {
		cfg.Listen = listen
	}
	if adminListen != "" {
		cfg.AdminListen = adminListen
	}
	if len(replicas) == 0 {
		return nil
	}
	fromFile := make(map[string]Replica, len(cfg.Replicas))
	for _, r := range cfg.Replicas {
		fromFile[r.Name] = r
	}
	var errs []error
	out := make([]Replica, 0, len(replicas))
	for _, flag := range replicas {
		r, err := parseReplicaFlag(flag)
		if err != nil {
			errs = append(errs, fmt.Errorf("config: --replica %q: %w", flag, err))
			continue
		}
		if old, ok := fromFile[r.Name]; ok {
			r.APIKey, r.Models, r.Metrics = old.APIKey, old.Models, old.Metrics
		}
		out = append(out, r)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	cfg.Replicas = out
	return nil
}

// parseReplicaFlag reads "name=URL" or "URL". The URL itself is checked by
// Validate, which names the replica.
func parseReplicaFlag(s string) (Replica, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Replica{}, errors.New("empty replica; write name=URL or URL")
	}
	name, rawURL, hasName := strings.Cut(s, "=")
	if !hasName || strings.Contains(name, "://") {
		// A bare URL (an "=" after "://" belongs to its query).
		name, rawURL = "", s
	} else if name = strings.TrimSpace(name); name == "" {
		return Replica{}, errors.New("empty name before '='; write name=URL or URL")
	}
	rawURL = strings.TrimSpace(rawURL)
	if rawURL == "" {
		return Replica{}, errors.New("no URL after '='; write name=URL")
	}
	if name == "" {
		name = defaultName(rawURL)
		if name == "" {
			return Replica{}, fmt.Errorf("%q is not an absolute http(s) URL (e.g. http://10.0.0.5:8000)", rawURL)
		}
	}
	return Replica{Name: name, URL: rawURL}, nil
}
