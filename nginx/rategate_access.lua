--[[
rategate_access: ask rategate whether this request may pass, from the access
phase of OpenResty or NGINX with lua-nginx-module.

    access_by_lua_block { require("rategate_access").check() }

check() captures the internal location /_rategate (rategate-subrequest.conf),
which proxies to rategate's /auth with the identity headers and no body, and
acts on the status of that subrequest. The subrequest gets a copy of every
variable of the request (copy_all_vars): lua-nginx-module otherwise gives it
fresh ones, and a $rategate_user built from an auth layer's answer
(auth_request_set $auth_user ...) would be empty there, making every user
behind one address one anonymous client.

lua-nginx-module refuses ngx.location.capture inside an HTTP/2 (or later)
request ("http2 requests not supported yet"), so this module cannot ask
rategate for one: it refuses such a request with 500 and an error-log line
that says so, and never lets it through unasked. Serve HTTP/2 with the
plain variant (rategate.conf), which asks through auth_request.

rategate's answer (or NGINX's, when it could not ask) is:

  2xx      the request goes on; rategate's rate-limit headers are added to
           whatever the application answers.
  429/403  a denial (403 when rategate runs with deny_status: 403): answers
           429 with Retry-After, the rate-limit headers and a one-line text
           body. Nothing is written to the error log.
  502/504  NGINX could not reach rategate (refused, reset, no live instance)
           or it did not answer in time: the request goes on (open) or gets
           503 (closed), as $rategate_on_failure says (rategate-upstream.conf).
           NGINX logs the connection error itself.
  503      rategate runs but its store failed and its failure_mode is deny:
           503.
  other    500 and one error-log line with rategate's answer (a 400 names the
           header the NGINX config fails to set).

A request with a control byte (other than a tab) in a header value gets 400
before rategate is asked (has_control_byte, below, says why).

The subrequest carries one copy of some headers the client sent twice
(User-Agent, Content-Type, Referer, ...: NGINX keeps one value of each,
and lua-nginx-module copies that one), while the application gets both
and may read the other. So check() names every header the client repeated
in X-Rategate-Repeated, and rategate refuses the request (400, a 500 here)
when a rule reads one of them, as it does when it sees the copies itself.

It records the decision in $rg_status, $rg_state, $rg_rule and
$rg_remaining (set to "" by rategate-lua.conf) for $rategate_status, the
application's X-RateLimit-Status and the "rategate" log format
(rategate-status.conf).
]]

local _M = { _VERSION = "1" }

local capture = ngx.location.capture

-- rategate's headers that go to the client on every decision.
local HEADERS = {
    "RateLimit-Policy", "RateLimit",
    "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
    "X-RateLimit-Status",
}
-- and those only a denial has.
local DENIAL_HEADERS = { "Retry-After", "X-RateLimit-Rule" }

local UNAVAILABLE = "Service Unavailable: the rate limiter cannot decide.\n"

-- lower returns the subrequest's headers keyed by lower-case name: header
-- names are case-insensitive, res.header is not.
local function lower(header)
    local t = {}
    for k, v in pairs(header) do
        t[k:lower()] = v
    end
    return t
end

-- copy sends the headers in names that the subrequest's answer has.
local function copy(names, from)
    for i = 1, #names do
        local v = from[names[i]:lower()]
        if v ~= nil then
            ngx.header[names[i]] = v
        end
    end
end

-- setvar sets an NGINX variable the configuration declares with "set"; a
-- configuration without it (an older copy of rategate-lua.conf) loses only
-- the logging, not the decision.
local function assign(name, value)
    ngx.var[name] = value
end

local function setvar(name, value)
    pcall(assign, name, value)
end

-- record keeps the decision for the access log and the application.
local function record(status, header)
    setvar("rg_status", tostring(status))
    setvar("rg_state", header["x-ratelimit-status"] or "")
    setvar("rg_rule", header["x-ratelimit-rule"] or "")
    setvar("rg_remaining", header["x-ratelimit-remaining"] or "")
end

-- answer ends the request with status and a short text body.
local function answer(status, body)
    ngx.status = status
    ngx.header["Content-Type"] = "text/plain"
    ngx.header["Content-Length"] = #body
    ngx.print(body)
    -- HTTP_OK after the response is out: end the request, not just the phase.
    return ngx.exit(ngx.HTTP_OK)
end

-- CONTROL matches a control byte other than a tab in a header value (CR and
-- LF end the header lines of the raw head).
local CONTROL = [=[[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]]=]

local function raw_header()
    return ngx.req.raw_header(true)
end

-- http2 reports whether the request came over HTTP/2 or later.
-- ngx.req.http_version() is nil for an HTTP/1 minor version it does not
-- know ("GET / HTTP/1.9", which NGINX accepts and serves as HTTP/1.x):
-- that is HTTP/1 too.
local function http2()
    return (ngx.req.http_version() or 1) >= 2
end

-- has_control_byte reports whether a header of the request holds a control
-- byte. lua-nginx-module copies such a value into the subrequest as %XX
-- (k\x0b reaches rategate as "k%0B"), where it would be a fresh identity,
-- while the application gets the byte itself and may trim it ("k"); without
-- Lua, NGINX passes the byte on and rategate refuses the request.
local function has_control_byte()
    local v = ngx.req.http_version()
    if v and v < 1 then
        -- HTTP/0.9 has no headers (and raw_header returns no head of them)
        return false
    end
    if not http2() then
        local ok, raw = pcall(raw_header)
        if ok and not ngx.re.find(raw, CONTROL, "jo") then
            return false
        end
        -- a control byte in the raw head is confirmed in the parsed
        -- headers: for a request without any header line (an HTTP/1.0
        -- "GET / HTTP/1.0" and an empty line) raw_header does not return
        -- the head as written
    end
    -- no raw head (HTTP/2 and later), or one to confirm: the parsed headers
    for _, v in pairs(ngx.req.get_headers(0, true)) do
        if type(v) == "table" then
            v = table.concat(v, "\n")
        end
        if ngx.re.find(v, CONTROL, "jo") then
            return true
        end
    end
    return false
end

-- REPEATED is the header that names, for rategate, the request headers the
-- client sent more than once (rategate's handler reads it).
local REPEATED = "X-Rategate-Repeated"

-- repeated returns the names (lower case, ", " between them) of the
-- request's headers sent more than once, or nil.
local function repeated()
    local names
    for name, v in pairs(ngx.req.get_headers(0)) do
        if type(v) == "table" then
            names = names and (names .. ", " .. name) or name
        end
    end
    return names
end

-- absolute reports whether the request line's target is in absolute form
-- ("GET http://api.example/x HTTP/1.1"; origin form starts with "/",
-- asterisk form is "*"). NGINX then serves the request for the target's
-- host whatever the Host header says, and $host is that host; but the
-- subrequest ngx.location.capture makes takes its $host (X-Original-Host)
-- from the Host header it copies, which the client chose.
local function absolute()
    local line = ngx.var.request
    local first = line and line:match("^%S+%s+(%S)")
    return first ~= nil and first ~= "/" and first ~= "*"
end

-- h2_logged is when this worker last logged a refused HTTP/2 request,
-- h2_refused how many it refused since.
local h2_logged, h2_refused = 0, 0

-- check decides the current request. location is the internal location that
-- proxies to rategate's /auth; default "/_rategate".
function _M.check(location)
    -- $request_id is made on first use: make it in this request, so the
    -- copy the subrequest gets (and sends as X-Request-Id) is the one the
    -- access log writes.
    local _ = ngx.var.request_id
    if has_control_byte() then
        record(400, {})
        return answer(400, "Bad Request: a request header holds a control byte.\n")
    end
    if http2() then
        -- refused, never let through unasked: see the header of this file.
        -- One error-log line a minute per worker, with the count: a client
        -- must not choose how fast the log grows.
        record(500, {})
        h2_refused = h2_refused + 1
        local now = ngx.now()
        if now - h2_logged >= 60 then
            ngx.log(ngx.ERR, "rategate: cannot ask rategate in an HTTP/",
                ngx.req.http_version(), " request: lua-nginx-module refuses",
                " ngx.location.capture there; serve HTTP/2 with the plain",
                " variant (rategate.conf) or turn http2 off on this server",
                " (docs/nginx.md); ", h2_refused, " refused by this worker",
                " since its last such line")
            h2_logged, h2_refused = now, 0
        end
        return ngx.exit(ngx.HTTP_INTERNAL_SERVER_ERROR)
    end
    if absolute() then
        -- the Host a proxy must send for such a request (RFC 9112, 3.2.2),
        -- and the one the subrequest's $host is then read from
        ngx.req.set_header("Host", ngx.var.host)
    end
    -- set or cleared: a client's own copy never reaches rategate
    ngx.req.set_header(REPEATED, repeated())
    local res = capture(location or "/_rategate", { copy_all_vars = true })
    ngx.req.clear_header(REPEATED) -- not the application's
    local status = res.status
    local header = lower(res.header)
    copy(HEADERS, header)
    record(status, header)

    if status >= 200 and status < 300 then
        return
    end
    if status == 429 or status == 403 then
        copy(DENIAL_HEADERS, header)
        local rule = header["x-ratelimit-rule"] or ""
        return answer(429, 'Too Many Requests: rate limit "' .. rule
            .. '" exceeded, see Retry-After.\n')
    end
    if status == 502 or status == 504 then
        -- The internal location's error_page does not apply to Lua
        -- subrequests, so the failure policy is applied here.
        if ngx.var.rategate_on_failure == "closed" then
            return answer(503, UNAVAILABLE)
        end
        return
    end
    if status == 503 then
        return answer(503, UNAVAILABLE)
    end
    ngx.log(ngx.ERR, "rategate answered unexpected status ", status, ": ",
        (res.body or ""):sub(1, 200))
    return ngx.exit(ngx.HTTP_INTERNAL_SERVER_ERROR)
end

return _M
