package testredis

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of test clusters: a primary
// that stops answering is failed over after about twice this. Shorter
// timeouts make starved nodes on a busy test machine fail each other.
const ClusterNodeTimeout = 2000 * time.Millisecond

// Cluster is a real Redis Cluster of 3 primaries and 3 replicas on loopback,
// made by `redis-cli --cluster create`. Roles change when a test kills a
// primary; ask Primaries for the current ones.
type Cluster struct {
	// Nodes are the six servers; the first three started as primaries.
	Nodes []*Server
}

// StartCluster starts six cluster-enabled redis-servers on free ports,
// joins them with `redis-cli --cluster create --cluster-replicas 1`, waits
// until every node reports cluster_state:ok with all slots served and every
// replica in sync, and stops every server at cleanup, whatever happens.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := NewCluster(t.TempDir)
	if c != nil {
		t.Cleanup(c.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NewCluster is StartCluster for a cluster that outlives one test (shared
// by a package's tests from TestMain): the caller must call Stop. dir
// returns a fresh directory for each node. Its servers die with the test
// binary in any case.
func NewCluster(dir func() string) (*Cluster, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: %s", InstallHint)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli not found in PATH: %s", InstallHint)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := startCluster(dir, bin, cli)
		if err == nil {
			return c, nil
		}
		lastErr = fmt.Errorf("attempt %d: %w", attempt+1, err)
	}
	return nil, fmt.Errorf("could not start a Redis Cluster: %w", lastErr)
}

func startCluster(dir func() string, bin, cli string) (*Cluster, error) {
	c := &Cluster{}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	ports, err := freePorts(12)
	if err != nil {
		return nil, err
	}
	for i := 0; i < 6; i++ {
		s := &Server{Port: ports[2*i], Dir: dir(), bin: bin}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		s.args = []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.Port),
			"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[2*i+1]),
			"--cluster-config-file", filepath.Join(s.Dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond)),
			// any replica may be promoted, however long it was disconnected
			"--cluster-replica-validity-factor", "0",
			// replicas sync at once (the default waits 5 s for more replicas)
			"--repl-diskless-sync-delay", "0",
			"--save", "", "--appendonly", "no", "--dir", s.Dir, "--daemonize", "no",
			"--logfile", filepath.Join(s.Dir, "redis.log")}
		c.Nodes = append(c.Nodes, s)
		if err := s.start(); err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(20 * time.Second); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}

// Addrs returns every node's address, the seeds for a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Node returns the server listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Client returns a cluster client over every node, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// NodeClient returns a plain client to one node, closed at cleanup.
func NodeClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	nc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: time.Second})
	t.Cleanup(func() { nc.Close() })
	return nc
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID, Addr string
	Primary  bool
	// PrimaryID is the ID of a replica's primary.
	PrimaryID string
	// Failed is true when the node is flagged fail or fail?.
	Failed bool
	// Slots are the slot ranges a primary serves ("0-5460").
	Slots []string
}

// Topology returns CLUSTER NODES as seen by the first running node that
// answers.
func (c *Cluster) Topology() ([]ClusterNode, error) {
	var lastErr error
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		text, err := oneShot(s.Addr, "CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		return parseClusterNodes(text), nil
	}
	return nil, fmt.Errorf("no cluster node answers: %v", lastErr)
}

func parseClusterNodes(text string) []ClusterNode {
	var nodes []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := ClusterNode{ID: f[0], Addr: f[1]}
		if i := strings.IndexByte(n.Addr, '@'); i >= 0 {
			n.Addr = n.Addr[:i]
		}
		flags := "," + f[2] + ","
		n.Primary = strings.Contains(flags, ",master,")
		n.Failed = strings.Contains(flags, ",fail,") || strings.Contains(flags, ",fail?,")
		if f[3] != "-" {
			n.PrimaryID = f[3]
		}
		for _, sl := range f[8:] {
			if !strings.HasPrefix(sl, "[") {
				n.Slots = append(n.Slots, sl)
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// Primaries returns the running primaries that serve slots, by address.
func (c *Cluster) Primaries() ([]ClusterNode, error) {
	nodes, err := c.Topology()
	if err != nil {
		return nil, err
	}
	var out []ClusterNode
	for _, n := range nodes {
		if n.Primary && !n.Failed && len(n.Slots) > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// PrimaryForSlot returns the address of the primary serving slot.
func (c *Cluster) PrimaryForSlot(slot int) (string, error) {
	ps, err := c.Primaries()
	if err != nil {
		return "", err
	}
	for _, p := range ps {
		for _, r := range p.Slots {
			lo, hi, _ := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if hi != "" {
				b, _ = strconv.Atoi(hi)
			}
			if slot >= a && slot <= b {
				return p.Addr, nil
			}
		}
	}
	return "", fmt.Errorf("no primary serves slot %d", slot)
}

// WaitHealthy waits until every running node reports cluster_state:ok with
// all 16384 slots ok and agrees on the primaries, and every replica's link
// to its primary is up.
func (c *Cluster) WaitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	var why string
	for time.Now().Before(deadline) {
		if why = c.unhealthy(); why == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster not healthy after %v: %s", within, why)
}

func (c *Cluster) unhealthy() string {
	var view string
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		info, err := oneShot(s.Addr, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Sprintf("%s: %v", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Sprintf("%s: %s", s.Addr, oneLine(info))
		}
		nodesText, err := oneShot(s.Addr, "CLUSTER", "NODES")
		if err != nil {
			return fmt.Sprintf("%s: %v", s.Addr, err)
		}
		var primaries []string
		replicas := 0
		for _, n := range parseClusterNodes(nodesText) {
			nd := c.Node(n.Addr)
			running := nd != nil && nd.Running()
			switch {
			case n.Primary && len(n.Slots) > 0:
				if n.Failed || !running {
					return fmt.Sprintf("%s sees primary %s failed", s.Addr, n.Addr)
				}
				primaries = append(primaries, n.Addr+" "+strings.Join(n.Slots, ","))
			case running && n.PrimaryID != "" && !n.Failed:
				replicas++
			case running:
				// A running node that is neither: its role has not
				// reached this node's view yet.
				return fmt.Sprintf("%s does not see %s as a primary or a replica yet", s.Addr, n.Addr)
			}
		}
		if want := c.running() - len(primaries); replicas != want {
			return fmt.Sprintf("%s sees %d replicas, want %d", s.Addr, replicas, want)
		}
		sort.Strings(primaries)
		v := strings.Join(primaries, "; ")
		if view == "" {
			view = v
		} else if v != view {
			return fmt.Sprintf("nodes disagree: %q vs %q", view, v)
		}
		repl, err := oneShot(s.Addr, "INFO", "replication")
		if err != nil {
			return fmt.Sprintf("%s: %v", s.Addr, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Sprintf("replica %s not in sync yet", s.Addr)
		}
	}
	return ""
}

// running counts the running nodes.
func (c *Cluster) running() int {
	n := 0
	for _, s := range c.Nodes {
		if s.Running() {
			n++
		}
	}
	return n
}

// FlushAll empties every primary.
func (c *Cluster) FlushAll() error {
	ps, err := c.Primaries()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := oneShot(p.Addr, "FLUSHALL"); err != nil {
			return fmt.Errorf("FLUSHALL on %s: %w", p.Addr, err)
		}
	}
	return nil
}

// Logs returns the tail of every node's log, for failure messages.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, s := range c.Nodes {
		l := s.Log()
		if len(l) > 2000 {
			l = l[len(l)-2000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", s.Addr, l)
	}
	return b.String()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// oneShot runs one command on addr over a fresh connection and returns its
// reply as text (bulk strings as is).
func oneShot(addr string, args ...any) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return "", err
	}
	return fmt.Sprint(v), nil
}

// Do runs one command on the server over a fresh connection and returns
// its reply as text.
func (s *Server) Do(args ...any) (string, error) { return oneShot(s.Addr, args...) }
