package signal

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/adaptive"
)

// vector is a Prometheus instant-vector answer with one series per value.
func vector(values ...string) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = fmt.Sprintf(`{"metric":{"instance":"i%d"},"value":[1700000000.123,%q]}`, i, v)
	}
	return `{"status":"success","data":{"resultType":"vector","result":[` + strings.Join(parts, ",") + `]}}`
}

// serve starts a real HTTP server on 127.0.0.1 answering with h.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func answer(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
}

func read(t *testing.T, src adaptive.Source, timeout time.Duration) (float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return NewReader().Read(ctx, &src)
}

func TestPrometheusAnswers(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		body   string
		reduce adaptive.Reduce
		want   float64
		reason string // "" = success
	}{
		{"one series", 200, vector("42.5"), adaptive.Single, 42.5, ""},
		{"scalar", 200, `{"status":"success","data":{"resultType":"scalar","result":[1700000000,"0.25"]}}`, adaptive.Single, 0.25, ""},
		{"negative", 200, vector("-3"), adaptive.Single, -3, ""},
		{"empty vector", 200, vector(), adaptive.Single, 0, "empty"},
		{"several series", 200, vector("1", "5", "3"), adaptive.Single, 0, "several_series"},
		{"several, max", 200, vector("1", "5", "3"), adaptive.Max, 5, ""},
		{"several, min", 200, vector("1", "5", "3"), adaptive.Min, 1, ""},
		{"several, sum", 200, vector("1", "5", "3"), adaptive.Sum, 9, ""},
		{"several, avg", 200, vector("1", "5", "3"), adaptive.Avg, 3, ""},
		{"NaN", 200, vector("NaN"), adaptive.Single, 0, "nan"},
		{"NaN among several", 200, vector("1", "NaN"), adaptive.Max, 0, "nan"},
		{"+Inf", 200, vector("+Inf"), adaptive.Single, 0, "infinite"},
		{"-Inf", 200, vector("-Inf"), adaptive.Single, 0, "infinite"},
		{"beyond float64", 200, vector("1e999"), adaptive.Single, 0, "infinite"},
		{"a sum that overflows", 200, vector("1e308", "1e308"), adaptive.Sum, 0, "infinite"},
		{"not a number", 200, vector("high"), adaptive.Single, 0, "not_a_number"},
		{"value not a string", 200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,42]}]}}`, adaptive.Single, 0, "not_a_number"},
		{"value not a pair", 200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":["42"]}]}}`, adaptive.Single, 0, "not_a_number"},
		{"matrix", 200, `{"status":"success","data":{"resultType":"matrix","result":[]}}`, adaptive.Single, 0, "not_a_number"},
		{"string", 200, `{"status":"success","data":{"resultType":"string","result":[1,"x"]}}`, adaptive.Single, 0, "not_a_number"},
		{"not JSON", 200, "42", adaptive.Single, 0, "not_a_number"},
		{"JSON of something else", 200, `[1,2,3]`, adaptive.Single, 0, "not_a_number"},
		{"query error", 400, `{"status":"error","errorType":"bad_data","error":"parse error at char 3"}`, adaptive.Single, 0, "bad_status"},
		{"error status in a 200", 200, `{"status":"error","error":"boom"}`, adaptive.Single, 0, "bad_status"},
		{"503 without JSON", 503, "overloaded", adaptive.Single, 0, "bad_status"},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := serve(t, answer(c.status, c.body))
			v, err := read(t, adaptive.Source{Kind: adaptive.Prometheus, URL: url, Query: "load", Reduce: c.reduce}, 2*time.Second)
			checkReading(t, v, err, c.want, c.reason)
		})
	}
}

func checkReading(t *testing.T, v float64, err error, want float64, reason string) {
	t.Helper()
	if reason == "" {
		if err != nil || v != want {
			t.Fatalf("got %g, %v; want %g", v, err, want)
		}
		return
	}
	if err == nil {
		t.Fatalf("got %g, want a %s error", v, reason)
	}
	if got := adaptive.ReasonOf(err).String(); got != reason {
		t.Fatalf("reason %s (%v), want %s", got, err, reason)
	}
	if v != 0 {
		t.Errorf("a failed reading returned %g", v)
	}
}

// TestPrometheusRequest: the query goes to /api/v1/query, escaped, with or
// without a trailing slash on the base URL.
func TestPrometheusRequest(t *testing.T) {
	const q = `avg(rate(cpu{mode!="idle",job=~"a|b"}[1m])) * 100 + 1`
	var got atomic.Value
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Method + " " + r.URL.Path + " " + r.URL.Query().Get("query"))
		fmt.Fprint(w, vector("7"))
	})
	for _, base := range []string{url, url + "/"} {
		v, err := read(t, adaptive.Source{Kind: adaptive.Prometheus, URL: base, Query: q}, 2*time.Second)
		if err != nil || v != 7 {
			t.Fatalf("%s: %g, %v", base, v, err)
		}
		if want := "GET /api/v1/query " + q; got.Load() != want {
			t.Errorf("%s: request %q, want %q", base, got.Load(), want)
		}
	}
}

func TestHTTPAnswers(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		body   string
		want   float64
		reason string
	}{
		{"a number", 200, "42.5\n", 42.5, ""},
		{"spaces", 200, "  \t17 \r\n", 17, ""},
		{"exponent", 200, "1e3", 1000, ""},
		{"empty", 200, "", 0, "not_a_number"},
		{"words", 200, "load is high", 0, "not_a_number"},
		{"two numbers", 200, "1 2", 0, "not_a_number"},
		{"a percent sign", 200, "50%", 0, "not_a_number"},
		{"NaN", 200, "NaN", 0, "nan"},
		{"Inf", 200, "+Inf", 0, "infinite"},
		{"infinity spelt out", 200, "-infinity", 0, "infinite"},
		{"too big for a float64", 200, "1e400", 0, "infinite"},
		{"500", 500, "42", 0, "bad_status"},
		{"404", 404, "not found", 0, "bad_status"},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := serve(t, answer(c.status, c.body))
			v, err := read(t, adaptive.Source{Kind: adaptive.HTTP, URL: url + "/load"}, 2*time.Second)
			checkReading(t, v, err, c.want, c.reason)
		})
	}
}

// TestHostileEndpoints: what a broken or compromised exporter can do costs
// at most the timeout and MaxBody bytes, and is an error with its reason.
func TestHostileEndpoints(t *testing.T) {
	const timeout = 300 * time.Millisecond
	promQL := func(url string) adaptive.Source {
		return adaptive.Source{Kind: adaptive.Prometheus, URL: url, Query: "load"}
	}
	plain := func(url string) adaptive.Source { return adaptive.Source{Kind: adaptive.HTTP, URL: url} }

	t.Run("slow to answer", func(t *testing.T) {
		url := serve(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
			fmt.Fprint(w, "1")
		})
		start := time.Now()
		v, err := read(t, plain(url), timeout)
		checkReading(t, v, err, 0, "timeout")
		if d := time.Since(start); d > timeout+500*time.Millisecond {
			t.Errorf("a slow endpoint held the reading %v (timeout %v)", d, timeout)
		}
	})
	t.Run("trickling the body", func(t *testing.T) {
		url := serve(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			for i := 0; i < 100; i++ {
				if _, err := w.Write([]byte("1")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-time.After(50 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
		})
		start := time.Now()
		v, err := read(t, plain(url), timeout)
		checkReading(t, v, err, 0, "timeout")
		if d := time.Since(start); d > timeout+500*time.Millisecond {
			t.Errorf("a trickling endpoint held the reading %v (timeout %v)", d, timeout)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		v, err := read(t, promQL("http://"+addr), timeout)
		checkReading(t, v, err, 0, "unreachable")
	})
	t.Run("endless body", func(t *testing.T) {
		url := serve(t, func(w http.ResponseWriter, _ *http.Request) {
			chunk := bytes.Repeat([]byte("9"), 32<<10)
			for i := 0; i < 64; i++ { // 2 MiB
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		})
		v, err := read(t, plain(url), 2*time.Second)
		checkReading(t, v, err, 0, "too_large")
	})
	t.Run("a vector of 20000 series", func(t *testing.T) {
		body := vector(strings.Split(strings.Repeat("1,", 20000), ",")...)
		url := serve(t, answer(200, body))
		v, err := read(t, adaptive.Source{Kind: adaptive.Prometheus, URL: url, Query: "x", Reduce: adaptive.Sum}, 2*time.Second)
		checkReading(t, v, err, 0, "too_large")
	})
	t.Run("huge headers", func(t *testing.T) {
		url := serve(t, func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i < 100; i++ {
				w.Header().Add(fmt.Sprintf("X-Pad-%d", i), strings.Repeat("a", 1000))
			}
			fmt.Fprint(w, "1")
		})
		v, err := read(t, plain(url), 2*time.Second)
		checkReading(t, v, err, 0, "unreachable")
	})
	t.Run("redirect is not followed", func(t *testing.T) {
		var followed atomic.Int32
		target := serve(t, func(w http.ResponseWriter, _ *http.Request) {
			followed.Add(1)
			fmt.Fprint(w, "1")
		})
		url := serve(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target, http.StatusFound)
		})
		v, err := read(t, plain(url), 2*time.Second)
		checkReading(t, v, err, 0, "bad_status")
		if followed.Load() != 0 {
			t.Error("the redirect was followed")
		}
	})
	t.Run("gzip is not undone", func(t *testing.T) {
		url := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Accept-Encoding") != "" {
				t.Errorf("Accept-Encoding %q sent", r.Header.Get("Accept-Encoding"))
			}
			var b bytes.Buffer
			z := gzip.NewWriter(&b)
			z.Write([]byte("42"))
			z.Close()
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(b.Bytes())
		})
		v, err := read(t, plain(url), 2*time.Second)
		checkReading(t, v, err, 0, "not_a_number")
	})
	t.Run("error text is bounded and escaped", func(t *testing.T) {
		url := serve(t, answer(500, "\x1b[31mred\n"+strings.Repeat("x", 10000)))
		_, err := read(t, plain(url), 2*time.Second)
		if err == nil {
			t.Fatal("no error")
		}
		if msg := err.Error(); len(msg) > 300 || strings.ContainsAny(msg, "\x1b\n") {
			t.Errorf("error message of %d bytes, or with control bytes: %q", len(msg), msg)
		}
	})
}
