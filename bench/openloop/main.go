// Command openloop is the fixed-rate ("open-loop") load generator of
// rategate's benchmark, for the one measurement wrk cannot make: latency
// at a given request rate. Debian ships wrk, not wrk2.
//
// Each of -connections keep-alive connections sends its share of -rate on
// a fixed schedule, like wrk2: request i of connection c is due at
// start + (c + i*connections)/rate. A request's latency runs from when it
// was due, not from when it was sent, so a stall that delays the requests
// behind it counts for every one of them (no coordinated omission). The
// users and paths are those of bench/wrk/users.lua in nginx mode: GET
// <prefix>items/<n> with the demo identity header X-User: user<n>.
//
//	openloop -addr 127.0.0.1:18000 -rate 15000 -duration 5s
//
// It prints one JSON object (see report) on stdout.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// report is what openloop prints. Latencies are in microseconds.
type report struct {
	TargetRate   float64        `json:"target_rate"`
	AchievedRate float64        `json:"achieved_rate"`
	Connections  int            `json:"connections"`
	DurationS    float64        `json:"duration_s"`
	Completed    int            `json:"completed"`
	Errors       int            `json:"errors"`
	Status       map[string]int `json:"status"`
	P50US        float64        `json:"p50_us"`
	P90US        float64        `json:"p90_us"`
	P99US        float64        `json:"p99_us"`
	P999US       float64        `json:"p999_us"`
	MaxUS        float64        `json:"max_us"`
	// LateSends is how many requests were sent more than 1 ms after they
	// were due because their connection was still busy or the generator
	// itself was late; a large share means the generator or the target
	// could not keep the rate.
	LateSends int `json:"late_sends"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8000", "target `host:port` (HTTP/1.1, keep-alive)")
	rate := flag.Float64("rate", 1000, "requests per second, in total")
	duration := flag.Duration("duration", 5*time.Second, "measured time")
	warmup := flag.Duration("warmup", time.Second, "time before the measurement whose requests are sent but not counted")
	conns := flag.Int("connections", 50, "connections")
	users := flag.Int("users", 10000, "distinct users (X-User: user1..userN)")
	prefix := flag.String("prefix", "/api/", "path prefix")
	flag.Parse()
	if *rate <= 0 || *conns <= 0 || *users <= 0 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "openloop: -rate, -connections, -users and -duration must be > 0")
		os.Exit(2)
	}
	r, err := run(*addr, *rate, *duration, *warmup, *conns, *users, *prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "openloop:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}

// worker is one connection's results.
type worker struct {
	lat    []int64 // µs, measured requests only
	status map[int]int
	errs   int
	late   int
}

func run(addr string, rate float64, duration, warmup time.Duration, conns, users int, prefix string) (*report, error) {
	reqs := make([][]byte, users)
	for i := range reqs {
		reqs[i] = fmt.Appendf(nil, "GET %sitems/%d HTTP/1.1\r\nHost: %s\r\nX-User: user%d\r\n\r\n", prefix, (i+1)%100, addr, i+1)
	}
	// Dial everything before the clock starts.
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			for _, c := range cs[:i] {
				c.Close()
			}
			return nil, err
		}
		cs[i] = c
	}

	interval := time.Duration(float64(time.Second) * float64(conns) / rate)
	start := time.Now().Add(50 * time.Millisecond)
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(duration)
	ws := make([]worker, conns)
	var wg sync.WaitGroup
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &ws[c]
			w.status = map[int]int{}
			first := start.Add(time.Duration(float64(time.Second) * float64(c) / rate))
			w.send(addr, cs[c], reqs, first, interval, measureFrom, end, uint64(c))
		}()
	}
	wg.Wait()

	r := &report{TargetRate: rate, Connections: conns, DurationS: duration.Seconds(), Status: map[string]int{}}
	var all []int64
	for i := range ws {
		all = append(all, ws[i].lat...)
		r.Errors += ws[i].errs
		r.LateSends += ws[i].late
		for s, n := range ws[i].status {
			r.Status[strconv.Itoa(s)] += n
		}
	}
	slices.Sort(all)
	r.Completed = len(all)
	r.AchievedRate = float64(len(all)) / duration.Seconds()
	if len(all) > 0 {
		q := func(p float64) float64 { return float64(all[min(len(all)-1, int(p*float64(len(all))))]) }
		r.P50US, r.P90US, r.P99US, r.P999US = q(0.50), q(0.90), q(0.99), q(0.999)
		r.MaxUS = float64(all[len(all)-1])
	}
	return r, nil
}

// send runs one connection's schedule until end.
func (w *worker) send(addr string, conn net.Conn, reqs [][]byte, due time.Time, interval time.Duration, measureFrom, end time.Time, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	br := bufio.NewReaderSize(conn, 16<<10)
	var resp fasthttp.Response
	defer func() { conn.Close() }()
	for ; due.Before(end); due = due.Add(interval) {
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else if -d > time.Millisecond {
			w.late++
		}
		measured := !due.Before(measureFrom)
		err := roundTrip(conn, br, &resp, reqs[rng.IntN(len(reqs))])
		done := time.Now()
		if err == nil || err == errClosed {
			if measured {
				w.lat = append(w.lat, done.Sub(due).Microseconds())
				w.status[resp.StatusCode()]++
			}
		} else {
			w.errs++
		}
		if err != nil {
			// Start over on a new connection; the time this takes delays
			// the requests behind it, and their latency says so.
			conn.Close()
			if conn, err = net.Dial("tcp", addr); err != nil {
				w.errs++
				return
			}
			br.Reset(conn)
		}
	}
}

// errClosed: the response was read, and the server closes the connection.
var errClosed = errors.New("server closed the connection")

// roundTrip writes one request and reads its response.
func roundTrip(conn net.Conn, br *bufio.Reader, resp *fasthttp.Response, req []byte) error {
	if _, err := conn.Write(req); err != nil {
		return err
	}
	resp.Reset()
	if err := resp.Read(br); err != nil {
		return err
	}
	if resp.ConnectionClose() {
		return errClosed
	}
	return nil
}
