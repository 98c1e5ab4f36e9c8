package metrics

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Linux reports process times in clock ticks of 1/100 s (USER_HZ, fixed at
// 100 on every architecture Go supports).
const userHZ = 100

// appendProcess writes the standard process_* metrics from /proc/self. On a
// system without /proc it writes nothing.
func appendProcess(e *expo) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields that follow start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15, starttime 22,
	// vsize 23, rss 24.
	field := func(n int) float64 {
		if n-3 >= len(f) {
			return 0
		}
		v, _ := strconv.ParseFloat(f[n-3], 64)
		return v
	}
	e.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
	e.sample("process_cpu_seconds_total", (field(14)+field(15))/userHZ)
	e.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
	e.sample("process_virtual_memory_bytes", field(23))
	e.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
	e.sample("process_resident_memory_bytes", field(24)*float64(os.Getpagesize()))
	if bt := bootTime(); bt > 0 {
		e.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
		e.sample("process_start_time_seconds", bt+field(22)/userHZ)
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		e.family("process_open_fds", "gauge", "Number of open file descriptors.")
		e.sample("process_open_fds", float64(len(fds)))
	}
	if max := maxFDs(); max > 0 {
		e.family("process_max_fds", "gauge", "Maximum number of open file descriptors.")
		e.sample("process_max_fds", max)
	}
}

// bootTime returns the system boot time (btime in /proc/stat), or 0.
func bootTime() float64 {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n
		}
	}
	return 0
}

// maxFDs returns the soft limit of open files from /proc/self/limits, or 0.
func maxFDs() float64 {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				n, err := strconv.ParseFloat(f[0], 64)
				if err == nil {
					return n
				}
			}
		}
	}
	return 0
}
