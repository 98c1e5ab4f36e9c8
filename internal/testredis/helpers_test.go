package testredis

import (
	"testing"
	"time"
)

func TestStartCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t)
	t.Logf("cluster up in %v", time.Since(start))
	ps, err := c.Primaries()
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("%d primaries, want 3: %+v", len(ps), ps)
	}
	nodes, err := c.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(nodes))
	}
}

func TestStartSentinel(t *testing.T) {
	start := time.Now()
	s := StartSentinel(t)
	t.Logf("sentinel setup up in %v", time.Since(start))
	addr, err := s.PrimaryAddr()
	if err != nil {
		t.Fatal(err)
	}
	if addr != s.Servers[0].Addr {
		t.Fatalf("sentinels name %s as primary, want %s", addr, s.Servers[0].Addr)
	}
}
