package testredis

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelInstallHint is the command that provides redis-sentinel.
const SentinelInstallHint = "apt-get update && apt-get install -y redis-sentinel (or run `make test`, which installs it)"

// SentinelDownAfter is the down-after-milliseconds of test sentinels: a
// primary that stops answering is failed over a second or two after this.
const SentinelDownAfter = 2000 * time.Millisecond

// SentinelMaster is the name the test sentinels monitor.
const SentinelMaster = "mymaster"

// SentinelSetup is a real Sentinel deployment on loopback: one primary, one
// replica and three redis-sentinel processes with quorum 2.
type SentinelSetup struct {
	// Master is the monitored name, SentinelMaster.
	Master string
	// Servers are the primary and the replica as started; after a failover
	// their roles are swapped (ask PrimaryAddr).
	Servers   []*Server
	Sentinels []*Server
}

// StartSentinel starts a primary, a replica of it and three sentinels
// monitoring it, waits until the replica is in sync and every sentinel
// knows the replica and the two other sentinels (so that a failover can
// happen), and stops every process at cleanup, whatever happens.
func StartSentinel(t testing.TB) *SentinelSetup {
	t.Helper()
	sbin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		t.Fatalf("redis-sentinel not found in PATH: %s", SentinelInstallHint)
	}
	primary := Start(t, "repl-diskless-sync-delay 0")
	replica := Start(t, "repl-diskless-sync-delay 0", "replicaof 127.0.0.1 "+strconv.Itoa(primary.Port))
	s := &SentinelSetup{Master: SentinelMaster, Servers: []*Server{primary, replica}}
	for i := 0; i < 3; i++ {
		s.Sentinels = append(s.Sentinels, startSentinel(t, sbin, primary.Port))
	}
	if err := s.waitReady(20 * time.Second); err != nil {
		t.Fatalf("sentinel setup not ready: %v\n%s", err, s.Logs())
	}
	return s
}

func startSentinel(t testing.TB, bin string, primaryPort int) *Server {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		sv := &Server{Port: FreePort(t), Dir: t.TempDir(), bin: bin}
		sv.Addr = "127.0.0.1:" + strconv.Itoa(sv.Port)
		// Sentinel rewrites its config file, so each gets its own.
		conf := filepath.Join(sv.Dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
dir %q
logfile %q
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, sv.Port, sv.Dir, filepath.Join(sv.Dir, "redis.log"), SentinelMaster, primaryPort,
			SentinelMaster, SentinelDownAfter.Milliseconds(), SentinelMaster, SentinelMaster)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatalf("write sentinel config: %v", err)
		}
		sv.args = []string{conf}
		if lastErr = sv.start(); lastErr == nil {
			t.Cleanup(sv.Stop)
			return sv
		}
	}
	t.Fatalf("redis-sentinel did not become ready: %v", lastErr)
	return nil
}

// Addrs returns the sentinels' addresses.
func (s *SentinelSetup) Addrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sv := range s.Sentinels {
		addrs[i] = sv.Addr
	}
	return addrs
}

// PrimaryAddr returns the primary the first answering sentinel names.
func (s *SentinelSetup) PrimaryAddr() (string, error) {
	var lastErr error
	for _, sv := range s.Sentinels {
		v, err := sv.Do("SENTINEL", "get-master-addr-by-name", s.Master)
		if err != nil {
			lastErr = err
			continue
		}
		f := strings.Fields(strings.Trim(v, "[]"))
		if len(f) == 2 {
			return f[0] + ":" + f[1], nil
		}
		lastErr = fmt.Errorf("get-master-addr-by-name answered %q", v)
	}
	return "", lastErr
}

// Server returns the data server listening on addr, or nil.
func (s *SentinelSetup) Server(addr string) *Server {
	for _, sv := range s.Servers {
		if sv.Addr == addr {
			return sv
		}
	}
	return nil
}

// WaitPrimary waits until every running sentinel names a primary other
// than old and that server answers as a primary; it returns its address.
func (s *SentinelSetup) WaitPrimary(old string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	var why string
	for time.Now().Before(deadline) {
		addr, ok := "", true
		for _, sv := range s.Sentinels {
			if !sv.Running() {
				continue
			}
			a, err := (&SentinelSetup{Master: s.Master, Sentinels: []*Server{sv}}).PrimaryAddr()
			switch {
			case err != nil:
				ok, why = false, err.Error()
			case a == old:
				ok, why = false, sv.Addr+" still names "+old
			case addr != "" && a != addr:
				ok, why = false, "sentinels disagree"
			}
			addr = a
		}
		if ok && addr != "" {
			role, err := oneShot(addr, "ROLE")
			if err == nil && strings.HasPrefix(strings.TrimPrefix(role, "["), "master") {
				return addr, nil
			}
			why = fmt.Sprintf("%s answers ROLE %q (%v)", addr, role, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("no new primary after %v: %s", within, why)
}

func (s *SentinelSetup) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	var why string
	for time.Now().Before(deadline) {
		if why = s.notReady(); why == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("after %v: %s", within, why)
}

func (s *SentinelSetup) notReady() string {
	repl, err := s.Servers[1].Do("INFO", "replication")
	if err != nil {
		return err.Error()
	}
	if !strings.Contains(repl, "master_link_status:up") {
		return "replica not in sync"
	}
	for _, sv := range s.Sentinels {
		info, err := sv.Do("SENTINEL", "master", s.Master)
		if err != nil {
			return sv.Addr + ": " + err.Error()
		}
		f := strings.Fields(strings.Trim(info, "[]"))
		fields := map[string]string{}
		for i := 0; i+1 < len(f); i += 2 {
			fields[f[i]] = f[i+1]
		}
		if fields["num-slaves"] != "1" || fields["num-other-sentinels"] != "2" {
			return fmt.Sprintf("%s knows %s replicas and %s other sentinels", sv.Addr, fields["num-slaves"], fields["num-other-sentinels"])
		}
	}
	return ""
}

// Logs returns the tail of every process's log, for failure messages.
func (s *SentinelSetup) Logs() string {
	var b strings.Builder
	for _, sv := range append(append([]*Server{}, s.Servers...), s.Sentinels...) {
		l := sv.Log()
		if len(l) > 2000 {
			l = l[len(l)-2000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", sv.Addr, l)
	}
	return b.String()
}
