package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/epp"
	"github.com/llmlb/llmlb/internal/server"
)

// DefaultGRPCListen is `llmlb epp`'s gRPC address: the port the Gateway
// API Inference Extension's InferencePool names for its endpoint picker.
const DefaultGRPCListen = ":9002"

// runEPP is `llmlb epp`: serve's routing core behind the Endpoint Picker
// Protocol (Envoy ext_proc over gRPC) for a Gateway API Inference
// Extension gateway. Everything but the proxy listener is serve's: config,
// replicas and discovery, policy, scraping, health, admin listener,
// reloads and drain. See docs/EPP.md.
func runEPP(ctx context.Context, args []string) error {
	return runBalancer(ctx, args, eppFlags, newEPPFrontend)
}

// newEPPFrontend builds the ext_proc server on srv's routing core, with
// serve's request parsing, body limit, metrics and dashboard, and flow
// control as the flow_control section configures it (epp's own queue).
func newEPPFrontend(srv *server.Server) (server.Frontend, error) {
	cfg := srv.Config()
	var tlsCfg *tls.Config
	if cfg.EPP.TLS.Enabled() {
		var err error
		if tlsCfg, err = epp.LoadTLS(cfg.EPP.TLS.CertFile, cfg.EPP.TLS.KeyFile, cfg.EPP.ClientCAFile); err != nil {
			return nil, err
		}
	}
	return epp.New(epp.Options{
		Balancer:     srv.Balancer(),
		Request:      srv.RequestConfig(),
		MaxBodyBytes: cfg.Proxy.MaxBodyBytes,
		RouteHeaders: cfg.Proxy.RouteHeaders,
		FlowControl:  cfg.FlowControl.Queue(),
		Metrics:      srv.Recorder(),
		Completion:   srv.Metrics().Completion,
		Decisions:    srv.Dashboard().Decision,
		Transitions:  srv.Transitions,
		Logger:       srv.Logger(),
		// The shared token of the gRPC port (docs/EPP.md): from the
		// environment only, never a flag (it would show in ps).
		Token:                 os.Getenv(EPPTokenEnv),
		BodyTimeout:           cfg.Server.ReadBodyTimeout,
		FirstByteTimeout:      cfg.Proxy.FirstByteTimeout,
		MaxInFlightPerReplica: cfg.EPP.MaxInFlightPerReplica,
		// One gateway connection's share; server.max_connections still
		// bounds the connections themselves.
		MaxExchangesPerConnection: cfg.EPP.MaxExchangesPerConnection,
		TLS:                       tlsCfg,
	})
}

// EPPTokenEnv names the environment variable holding the gRPC port's
// shared token ("": no token; docs/EPP.md).
const EPPTokenEnv = "LLMLB_EPP_TOKEN"

// eppFlags are serve's flags with --grpc-listen in place of --listen (the
// configuration file's listen key is not used by epp).
func eppFlags(args []string, stderr io.Writer) (config.Config, string, time.Duration, error) {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	listen := fs.String("grpc-listen", DefaultGRPCListen, "ext_proc gRPC listen `ADDR` (the InferencePool's endpoint picker port)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmlb epp [--grpc-listen ADDR] [--config FILE] [--admin-listen ADDR] [--replica URL|name=URL ...] [--policy P] [--log-level L]")
		fmt.Fprintln(stderr, "\nRuns llmlb's routing core as the endpoint picker (Envoy ext_proc v3 over gRPC) of a")
		fmt.Fprintln(stderr, "Gateway API Inference Extension InferencePool. Flags, file and LLMLB_<FLAG> environment")
		fmt.Fprintln(stderr, "variables are serve's (LLMLB_GRPC_LISTEN for --grpc-listen). The replicas' ip:port are the")
		fmt.Fprintln(stderr, "endpoints returned to the gateway. SIGTERM/SIGINT drain and exit. See docs/EPP.md.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	return balancerFlags(fs, listen, args, stderr)
}
