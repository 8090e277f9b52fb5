package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmlb/llmlb/internal/simreplica"
)

// TestEPPFlags: epp takes serve's flags and file, with --grpc-listen
// (default :9002, LLMLB_GRPC_LISTEN) in place of --listen.
func TestEPPFlags(t *testing.T) {
	cfg, _, _, err := eppFlags([]string{"--policy", "cache_aware", "--replica", "http://127.0.0.1:8001"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != DefaultGRPCListen || cfg.Routing.Policy != "prefix-tree" || len(cfg.Replicas) != 1 {
		t.Fatalf("defaults: listen %q policy %q replicas %v", cfg.Listen, cfg.Routing.Policy, cfg.Replicas)
	}
	if _, _, _, err := eppFlags([]string{"--listen", ":8080"}, io.Discard); err == nil {
		t.Fatal("--listen is serve's: epp must refuse it")
	}
	t.Setenv("LLMLB_GRPC_LISTEN", "127.0.0.1:19002")
	if cfg, _, _, err = eppFlags(nil, io.Discard); err != nil || cfg.Listen != "127.0.0.1:19002" {
		t.Fatalf("LLMLB_GRPC_LISTEN: %q %v", cfg.Listen, err)
	}
	if cfg, _, _, err = eppFlags([]string{"--grpc-listen", "127.0.0.1:29002"}, io.Discard); err != nil || cfg.Listen != "127.0.0.1:29002" {
		t.Fatalf("--grpc-listen wins over the environment: %q %v", cfg.Listen, err)
	}
	// serve is unchanged: its own --listen, no --grpc-listen.
	if _, err := serveConfig([]string{"--grpc-listen", ":9002"}, io.Discard); err == nil {
		t.Fatal("serve accepted --grpc-listen")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestRunEPP: `llmlb epp` serves gRPC health (SERVING once its replica is
// LIVE) and stops cleanly on cancel.
func TestRunEPP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleet, err := simreplica.StartFleet(ctx, simreplica.FleetOptions{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	grpcAddr, adminAddr := freeAddr(t), freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- runEPP(runCtx, []string{"--grpc-listen", grpcAddr, "--admin-listen", adminAddr,
			"--replica", fleet.Replicas[0].URL(), "--log-level", "error", "--watch-config", "0"})
	}()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("llmlb epp never reported SERVING: %v %v", resp, err)
		}
		select {
		case err := <-done:
			t.Fatalf("llmlb epp stopped: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("llmlb epp after cancel: %v", err)
	}
}

// TestEPPIsACommand: `llmlb epp` is listed with the others.
func TestEPPIsACommand(t *testing.T) {
	for _, c := range commands {
		if c.name == "epp" && strings.Contains(c.summary, "ext_proc") {
			return
		}
	}
	t.Fatal("no epp command")
}
