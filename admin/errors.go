package admin

import (
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"
)

// MaxBody is the largest request body the admin listener reads (an
// identity override, a rule override: a few hundred bytes in practice).
const MaxBody = 64 << 10

// ErrorHandler answers requests the admin listener could not read, in the
// API's JSON: a body over MaxBody is a 413 that says so, rather than
// fasthttp's "Error when parsing request".
func ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes (64 KiB), the most the admin API reads", MaxBody), nil)
		ctx.SetConnectionClose()
		return
	}
	// Not err's text: fasthttp quotes the offending header value in some
	// errors, and the request's Authorization header is one of them.
	writeError(ctx, fasthttp.StatusBadRequest, "cannot read the request: not valid HTTP (a bad request line, header line or Content-Length)", nil)
	ctx.SetConnectionClose()
}
