// Command redisinstr counts the instructions redis-server executes per
// decision of rategate's function library, under valgrind's callgrind: a
// figure that, unlike CPU time on a shared machine, is the same from run
// to run, so a change to the Lua code can be judged by a few percent.
//
// It starts redis-server under callgrind on a free loopback port, loads
// the library, and for each -cases entry sends batches as the Redis store
// does (one FCALL of DecideMany per -batch decisions, 4 clients), first to
// fill the keys, then measured. A case is a list of checks, one letter
// each, every one a sliding_window rule of a minute:
//
//	u  per user, 10,000 users at random (a key few decisions of a batch share)
//	r  per route, 100 routes: user n calls route n % 100 (as bench/wrk/users.lua)
//	R  per route, 3 routes (every batch holds its keys)
//	g  one global key (held by every batch)
//
// "u" is make bench's vs-minimal rule, "urg" its vs-minimal-multi three.
// Keys named by more than one decision of a batch are held, as the Redis
// store marks them (lua/records.lua). The count is user-space only: the
// kernel's share of reading and writing the connections (most of the rest
// of Redis's CPU per decision at these batch sizes) is not in it.
//
//	go run ./bench/redisinstr -cases u,urg,uRg    # about 15 s a case
//	go run ./bench/redisinstr -cases u,ur -repeat 1 -keep /tmp/cg
//	callgrind_annotate --inclusive=yes /tmp/cg/ur-0.out | head -60
//
// Needs valgrind (callgrind_control) and redis-server.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/lua"
)

const clients = 4

// keep is the -keep directory, or "".
var keep string

func main() {
	cases := flag.String("cases", "u,urg", "comma-separated cases (see the package comment)")
	batch := flag.Int("batch", 20, "decisions per FCALL")
	decisions := flag.Int("decisions", 8000, "measured decisions per case")
	repeat := flag.Int("repeat", 3, "runs per case; the median is printed (a rehash of Redis's keyspace or a Lua GC cycle may fall in one run)")
	flag.StringVar(&keep, "keep", "", "directory to keep each run's callgrind output in (<case>-<run>.out, for callgrind_annotate)")
	flag.Parse()
	// go-redis logs every refused dial while valgrind starts the server
	redis.SetLogger(quiet{})
	for _, c := range strings.Split(*cases, ",") {
		if c == "" || strings.Trim(c, "urRg") != "" {
			fail(fmt.Errorf("case %q: want letters of u, r, R, g", c))
		}
	}
	var first float64
	for i, c := range strings.Split(*cases, ",") {
		var runs []float64
		for run := range max(*repeat, 1) {
			n, err := measure(c, *batch, *decisions, run)
			if err != nil {
				fail(err)
			}
			runs = append(runs, n)
		}
		slices.Sort(runs)
		n := runs[len(runs)/2]
		if i == 0 {
			first = n
		}
		fmt.Printf("%-6s %8.0f instructions per decision (÷ %s: %.2f; runs %.0f–%.0f)\n", c, n, strings.Split(*cases, ",")[0], n/first,
			runs[0], runs[len(runs)-1])
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "redisinstr:", err)
	os.Exit(1)
}

// measure runs one case on a fresh redis-server under callgrind and
// returns the instructions it executed per measured decision.
func measure(spec string, batch, decisions, run int) (float64, error) {
	port, err := procs.FreePort()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "redisinstr")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "callgrind.out")
	srv := exec.Command("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file="+out,
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	srv.Dir = dir
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("valgrind: %w", err)
	}
	defer srv.Process.Kill() //nolint:errcheck // stopped by SHUTDOWN below; this is for an early return
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), PoolSize: clients})
	defer c.Close()
	up := false
	for range 150 {
		if c.Ping(ctx).Err() == nil {
			up = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !up {
		return 0, fmt.Errorf("redis-server under valgrind did not answer on port %d", port)
	}
	lib := lua.Library()
	if err := c.FunctionLoadReplace(ctx, lib.Source).Err(); err != nil {
		return 0, err
	}
	// Fill: most users' keys exist, as in a steady run.
	if err := drive(ctx, c, lib.DecideMany, spec, batch, 60000, 1); err != nil {
		return 0, err
	}
	pid := strconv.Itoa(srv.Process.Pid)
	if err := exec.Command("callgrind_control", "-i", "on", pid).Run(); err != nil {
		return 0, fmt.Errorf("callgrind_control: %w", err)
	}
	if err := drive(ctx, c, lib.DecideMany, spec, batch, decisions, 2); err != nil {
		return 0, err
	}
	if err := exec.Command("callgrind_control", "-i", "off", pid).Run(); err != nil {
		return 0, fmt.Errorf("callgrind_control: %w", err)
	}
	c.Shutdown(ctx) // the connection drops: no reply to read
	if err := srv.Wait(); err != nil {
		return 0, fmt.Errorf("redis-server under valgrind: %w", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return 0, err
	}
	if keep != "" {
		if err := os.WriteFile(filepath.Join(keep, fmt.Sprintf("%s-%d.out", spec, run)), b, 0o644); err != nil {
			return 0, err
		}
	}
	// the file's "totals:" line (its "summary:" may be written before
	// instrumentation starts)
	m := regexp.MustCompile(`(?m)^totals: (\d+)`).FindAllSubmatch(b, -1)
	if m == nil {
		return 0, fmt.Errorf("no instruction total in %s", out)
	}
	total, _ := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	if total == 0 {
		return 0, fmt.Errorf("callgrind counted nothing in %s", out)
	}
	return total / float64(decisions/(batch*clients)*batch*clients), nil
}

// drive sends about n decisions of spec in batches, from clients
// goroutines.
func drive(ctx context.Context, c *redis.Client, fn, spec string, batch, n int, seed uint64) error {
	rounds := n / (batch * clients)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for range rounds {
				keys, args := batchArgs(r, spec, batch)
				if err := c.FCall(ctx, fn, keys, args...).Err(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// batchArgs builds one DecideMany call (lua/decide_many.lua): the case's
// shapes, one combination of all of them, and batch decisions on the
// Redis clock, each holding the keys another decision of the batch names.
func batchArgs(r *rand.Rand, spec string, batch int) ([]string, []any) {
	n := len(spec)
	args := []any{batch, n, 1}
	for _, ch := range spec {
		limit := 1000 // the user rule
		if ch != 'u' {
			limit = 1_000_000_000
		}
		args = append(args, 3, limit, 60_000_000, 0, 0, 1) // sliding_window, 1 min, cost 1
	}
	args = append(args, n)
	for j := 1; j <= n; j++ {
		args = append(args, j)
	}
	seen := map[string]int{}
	keys := make([]string, 0, batch*n)
	for range batch {
		u := r.IntN(10000)
		for _, ch := range spec {
			var k string
			switch ch {
			case 'u':
				k = fmt.Sprintf("rg:{ri-user:user%d}:sw2", u)
			case 'r':
				k = fmt.Sprintf("rg:{ri-route:/swm/items/%d}:sw2", u%100)
			case 'R':
				k = fmt.Sprintf("rg:{ri-route:/swm/items/%d}:sw2", u%3)
			case 'g':
				k = "rg:{ri-global:}:sw2"
			}
			keys = append(keys, k)
			seen[k]++
		}
	}
	for d := range batch {
		x := int64(1)
		for j, k := range keys[d*n : (d+1)*n] {
			if seen[k] > 1 {
				x |= 1 << (16 + j)
			}
		}
		args = append(args, x)
	}
	return keys, args
}
