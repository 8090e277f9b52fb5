package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/request"
)

// FlowControl is the flow_control section (docs/FLOW_CONTROL.md): the
// queue's own settings (flowcontrol.Config, whose keys sit directly under
// flow_control), the per-tenant limits as a list, and where a request's
// tenant comes from.
type FlowControl struct {
	flowcontrol.Config
	// Tenants gives named tenants their own limits in place of
	// flow_control.tenant's (flow_control.tenants[]: name, max_concurrent,
	// tokens_per_minute).
	Tenants []NamedTenant
	// TenantFrom says what names a request's tenant: TenantFromHeader
	// (request.tenant_headers) or TenantFromAPIKey (a fingerprint of the
	// client's API key) (flow_control.tenant_from, "header").
	TenantFrom string
}

// NamedTenant is one tenant's limits (0 = none).
type NamedTenant struct {
	Name string // name: the tenant as tenant_from finds it
	flowcontrol.TenantLimits
}

// The values of flow_control.tenant_from.
const (
	// TenantFromHeader takes the tenant from request.tenant_headers; a
	// request without one belongs to the tenant "" (one shared share).
	TenantFromHeader = "header"
	// TenantFromAPIKey takes the tenant from the client's API key
	// (Authorization: Bearer, or X-Api-Key), named by its fingerprint
	// (request.KeyTenant) so that the key never shows.
	TenantFromAPIKey = "api_key"
)

// DefaultFlowControl returns the section's defaults: on, bounded, no
// tenant limits, tenants from headers.
func DefaultFlowControl() FlowControl {
	c := flowcontrol.DefaultConfig()
	c.PriorityRules = []flowcontrol.PriorityRule{}
	return FlowControl{Config: c, Tenants: []NamedTenant{}, TenantFrom: TenantFromHeader}
}

// Queue returns the queue's configuration, with the tenants list as the
// map flowcontrol.Config keeps.
func (f FlowControl) Queue() flowcontrol.Config {
	c := f.Config
	c.PriorityRules = slices.Clone(c.PriorityRules)
	c.Tenants = nil
	if len(f.Tenants) > 0 {
		c.Tenants = make(map[string]flowcontrol.TenantLimits, len(f.Tenants))
		for _, t := range f.Tenants {
			c.Tenants[t.Name] = t.TenantLimits
		}
	}
	return c
}

// flowControl checks the section: the queue's own settings (their messages
// name their keys), the tenants list and tenant_from.
func (v *validator) flowControl(f FlowControl) {
	q := f.Config
	q.Tenants = nil // the list is checked below, by index
	for _, err := range leaves(q.Validate()) {
		// Its messages name the key under flow_control already.
		v.errs = append(v.errs, errors.New("config: "+strings.TrimPrefix(err.Error(), "flowcontrol: ")))
	}
	v.oneOf("flow_control.tenant_from", f.TenantFrom, TenantFromHeader, TenantFromAPIKey)
	seen := make(map[string]int, len(f.Tenants))
	for i, t := range f.Tenants {
		key := fmt.Sprintf("flow_control.tenants[%d]", i)
		switch {
		case t.Name == "":
			v.add(key+".name", "empty tenant name")
		case len(t.Name) > request.MaxKeyBytes:
			v.add(key+".name", "longer than %d bytes: no request's tenant can be named so (longer ones are hashed)", request.MaxKeyBytes)
		}
		if first, dup := seen[t.Name]; dup && t.Name != "" {
			v.add(key+".name", "%q is also the name of flow_control.tenants[%d]; list each tenant once", t.Name, first)
		} else {
			seen[t.Name] = i
		}
		if t.MaxConcurrent < 0 {
			v.add(key+".max_concurrent", "must be >= 0 (0 = no limit), got %d", t.MaxConcurrent)
		}
		if t.TokensPerMinute < 0 {
			v.add(key+".tokens_per_minute", "must be >= 0 (0 = no limit), got %d", t.TokensPerMinute)
		}
	}
}
