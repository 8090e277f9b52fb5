package replicaurl

import "testing"

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "127.1.2.3:9090": true, "[::1]:9090": true, "localhost:9090": true, "LOCALHOST:1": true,
		":9090": false, "0.0.0.0:9090": false, "[::]:9090": false, "10.0.0.5:9090": false, "example.com:9090": false,
		"127.0.0.1": false, "": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
