package main

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// wrkResult is what one wrk run printed.
type wrkResult struct {
	Requests int64   `json:"requests"`
	RPS      float64 `json:"rps"`
	// Latency percentiles from --latency, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P75MS float64 `json:"p75_ms"`
	P90MS float64 `json:"p90_ms"`
	P99MS float64 `json:"p99_ms"`
	// Non2xx counts answers other than 2xx/3xx (the 429s of a denial).
	Non2xx int64 `json:"non_2xx"`
	// SocketErrors is connect+read+write+timeout.
	SocketErrors int64 `json:"socket_errors"`
}

var (
	reRequests = regexp.MustCompile(`^\s*(\d+) requests in ([0-9.]+\w+)`)
	reRPS      = regexp.MustCompile(`^Requests/sec:\s+([0-9.]+)`)
	rePct      = regexp.MustCompile(`^\s+(50|75|90|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	reNon2xx   = regexp.MustCompile(`^\s*Non-2xx or 3xx responses:\s+(\d+)`)
	reSocket   = regexp.MustCompile(`^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// parseWrk reads wrk's --latency output.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	var haveRPS, haveP99 bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := reRequests.FindStringSubmatch(line); m != nil {
			r.Requests, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if m := reRPS.FindStringSubmatch(line); m != nil {
			r.RPS, _ = strconv.ParseFloat(m[1], 64)
			haveRPS = true
		}
		if m := rePct.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			switch m[3] {
			case "us":
				v /= 1000
			case "s":
				v *= 1000
			}
			switch m[1] {
			case "50":
				r.P50MS = v
			case "75":
				r.P75MS = v
			case "90":
				r.P90MS = v
			case "99":
				r.P99MS = v
				haveP99 = true
			}
		}
		if m := reNon2xx.FindStringSubmatch(line); m != nil {
			r.Non2xx, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if m := reSocket.FindStringSubmatch(line); m != nil {
			for _, s := range m[1:] {
				n, _ := strconv.ParseInt(s, 10, 64)
				r.SocketErrors += n
			}
		}
	}
	if !haveRPS || !haveP99 || r.Requests == 0 {
		return r, fmt.Errorf("wrk output without Requests/sec, 99%% latency or a request count:\n%s", out)
	}
	return r, nil
}

// wrkArgs is wrk's command line for one run of users.lua.
func wrkArgs(threads, conns int, d time.Duration, script, url, mode, prefix string, users int) []string {
	return []string{
		"-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		// wrk takes whole seconds (or minutes, hours) only.
		"-d", fmt.Sprintf("%ds", max(int64(d.Round(time.Second)/time.Second), 1)), "--latency",
		"-s", script, url, "--", mode, prefix, strconv.Itoa(users),
	}
}
