// Package signal reads the load signal of an adaptive rule: one number,
// from a Prometheus-compatible query API or from an HTTP endpoint that
// answers it as text.
//
// The endpoint is outside rategate's trust. A reading is bounded in time
// (the caller's context, which must carry a deadline) and in size
// (MaxBody, MaxHeader); redirects are not followed, nothing is
// decompressed, no proxy from the environment is used, and every way an
// answer can be wrong is an *adaptive.Error with its reason, never a
// panic and never a number that is not finite.
package signal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rategate/rategate/adaptive"
)

// Bounds of what a reading accepts from the endpoint.
const (
	// MaxBody is the most rategate reads of an answer's body; a longer one
	// is too_large.
	MaxBody = 64 << 10
	// MaxHeader bounds the answer's header block.
	MaxHeader = 16 << 10
	// maxQuoted bounds text quoted from an answer in an error.
	maxQuoted = 120
)

// Reader reads signals. It is safe for concurrent use; one Reader serves
// every adaptive rule.
type Reader struct {
	client *http.Client
}

// NewReader returns a Reader with its own HTTP transport.
func NewReader() *Reader {
	tr := &http.Transport{
		Proxy:                  nil, // the signal is read directly, whatever HTTP_PROXY says
		DialContext:            (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:    10 * time.Second,
		MaxResponseHeaderBytes: MaxHeader,
		DisableCompression:     true, // what is read is what was sent: no gzip bomb
		MaxIdleConns:           16,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        90 * time.Second,
	}
	return &Reader{client: &http.Client{
		Transport: tr,
		// A redirect is an answer like any other that is not a 2xx.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Read reads src once. ctx bounds the whole reading (connection, headers
// and body); give it the rule's timeout.
func (r *Reader) Read(ctx context.Context, src *adaptive.Source) (float64, error) {
	target := src.URL
	accept := "text/plain"
	if src.Kind == adaptive.Prometheus {
		target = strings.TrimSuffix(src.URL, "/") + "/api/v1/query?" + url.Values{"query": {src.Query}}.Encode()
		accept = "application/json"
	}
	body, status, err := r.get(ctx, target, accept)
	if err != nil {
		return 0, err
	}
	if src.Kind == adaptive.Prometheus {
		return parseQueryAnswer(body, status, src.Reduce)
	}
	if status < 200 || status > 299 {
		return 0, &adaptive.Error{Reason: adaptive.BadStatus, Detail: fmt.Sprintf("HTTP %d %s", status, quote(body))}
	}
	return parseNumber(body)
}

// get sends one GET and reads at most MaxBody bytes of the answer.
func (r *Reader) get(ctx context.Context, target, accept string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a password
		}
		return nil, 0, &adaptive.Error{Reason: adaptive.Unreachable, Detail: "bad URL: " + err.Error()}
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "rategate-adaptive")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, 0, transportError(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, 0, transportError(ctx, err)
	}
	if len(body) > MaxBody {
		return nil, 0, &adaptive.Error{Reason: adaptive.TooLarge, Detail: fmt.Sprintf("the answer is longer than %d bytes", MaxBody)}
	}
	return body, resp.StatusCode, nil
}

// transportError classifies a failure to connect or to read the answer.
func transportError(ctx context.Context, err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &adaptive.Error{Reason: adaptive.Timeout, Detail: "no complete answer in time"}
	}
	if errors.Is(err, context.Canceled) {
		return &adaptive.Error{Reason: adaptive.Unreachable, Detail: "canceled"}
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	return &adaptive.Error{Reason: adaptive.Unreachable, Detail: msg}
}

// parseNumber reads a plain answer: one number, surrounding white space
// allowed ("42.5\n").
func parseNumber(body []byte) (float64, error) {
	s := strings.TrimSpace(string(body))
	if s == "" {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "the answer is empty"}
	}
	return parseValue(s)
}

// parseValue reads one number as Prometheus and plain endpoints write it.
func parseValue(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	var ne *strconv.NumError
	if err != nil && !(errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange)) {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "not a number: " + quote([]byte(s))}
	}
	switch {
	case math.IsNaN(v):
		return 0, &adaptive.Error{Reason: adaptive.NaN, Detail: "the value is NaN"}
	case math.IsInf(v, 0): // "+Inf", or a number too large for a float64 (a range error)
		return 0, &adaptive.Error{Reason: adaptive.Infinite, Detail: "the value is infinite: " + quote([]byte(s))}
	}
	return v, nil
}

// queryAnswer is the JSON of /api/v1/query.
type queryAnswer struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
}

// parseQueryAnswer reads an instant query's answer down to one value.
func parseQueryAnswer(body []byte, status int, reduce adaptive.Reduce) (float64, error) {
	var a queryAnswer
	jerr := json.Unmarshal(body, &a)
	if status < 200 || status > 299 {
		detail := fmt.Sprintf("HTTP %d", status)
		if jerr == nil && a.Error != "" {
			detail += " " + quote([]byte(a.Error))
		} else {
			detail += " " + quote(body)
		}
		return 0, &adaptive.Error{Reason: adaptive.BadStatus, Detail: detail}
	}
	if jerr != nil {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "not the JSON of a query answer: " + quote([]byte(jerr.Error()))}
	}
	if a.Status != "success" {
		return 0, &adaptive.Error{Reason: adaptive.BadStatus, Detail: fmt.Sprintf("query status %s %s", quote([]byte(a.Status)), quote([]byte(a.Error)))}
	}
	switch a.Data.ResultType {
	case "scalar":
		return sampleValue(a.Data.Result)
	case "vector":
	default:
		return 0, &adaptive.Error{Reason: adaptive.NotANumber,
			Detail: "the query must give an instant vector or a scalar, got " + quote([]byte(a.Data.ResultType))}
	}
	var series []struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(a.Data.Result, &series); err != nil {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "the vector is not a list of samples"}
	}
	switch {
	case len(series) == 0:
		return 0, &adaptive.Error{Reason: adaptive.Empty, Detail: "the query gave no series"}
	case len(series) > 1 && reduce == adaptive.Single:
		return 0, &adaptive.Error{Reason: adaptive.SeveralSeries,
			Detail: fmt.Sprintf("the query gave %d series; aggregate them in the query or set reduce", len(series))}
	}
	var acc float64
	for i, s := range series {
		v, err := sampleValue(s.Value)
		if err != nil {
			return 0, err
		}
		switch {
		case i == 0:
			acc = v
		case reduce == adaptive.Max:
			acc = max(acc, v)
		case reduce == adaptive.Min:
			acc = min(acc, v)
		default: // sum, avg
			acc += v
		}
	}
	if reduce == adaptive.Avg {
		acc /= float64(len(series))
	}
	if math.IsInf(acc, 0) { // a sum of huge values
		return 0, &adaptive.Error{Reason: adaptive.Infinite, Detail: "the reduced value is infinite"}
	}
	return acc, nil
}

// sampleValue reads one [<time>, "<value>"] pair.
func sampleValue(raw json.RawMessage) (float64, error) {
	var pair []json.RawMessage
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "a sample is not a [time, value] pair"}
	}
	var s string
	if err := json.Unmarshal(pair[1], &s); err != nil {
		return 0, &adaptive.Error{Reason: adaptive.NotANumber, Detail: "a sample's value is not a string: " + quote(pair[1])}
	}
	return parseValue(s)
}

// quote returns b as a short Go-quoted string: text from the endpoint
// goes into logs only escaped and bounded.
func quote(b []byte) string {
	b = bytes.TrimSpace(b)
	cut := ""
	if len(b) > maxQuoted {
		b, cut = b[:maxQuoted], "..."
	}
	return strconv.Quote(string(b)) + cut
}
