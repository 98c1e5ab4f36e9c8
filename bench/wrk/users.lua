-- wrk script of `make bench`: every request comes from a random one of N
-- users, chosen uniformly per request.
--
--   wrk ... http://127.0.0.1:PORT -- nginx  /api/ 10000   # through NGINX
--   wrk ... http://127.0.0.1:PORT -- direct /api/ 10000   # straight to /auth
--
-- nginx:  GET <prefix>items/<n> with the demo identity header X-User (NGINX
--         turns it into X-User-Id, nginx/rategate-identity-demo.conf).
-- direct: GET /auth with the headers NGINX would set (X-Original-URI,
--         -Method, -Host, X-Real-IP, X-User-Id), as the subrequest does.
-- Users are user1..userN; each user always uses the same route (one of 100),
-- so a rule keyed on the route sees 100 identities.
--
-- The requests are built once in init(), so the Lua cost per request is a
-- table look-up, the same for the floor and rategate runs.

local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end

local reqs = {}

function init(args)
  local mode, prefix, users = args[1], args[2], tonumber(args[3])
  if mode ~= "nginx" and mode ~= "direct" then
    error("users.lua: first argument must be nginx or direct, got " .. tostring(mode))
  end
  if not prefix or not users or users < 1 then
    error("users.lua: usage: -- nginx|direct PREFIX USERS")
  end
  math.randomseed(os.time() * 1000 + (id or 0))
  for i = 1, users do
    local user = "user" .. i
    local path = prefix .. "items/" .. (i % 100)
    if mode == "direct" then
      reqs[i] = wrk.format("GET", "/auth", {
        ["X-Original-URI"] = path,
        ["X-Original-Method"] = "GET",
        ["X-Original-Host"] = "bench.local",
        ["X-Real-IP"] = "127.0.0.1",
        ["X-User-Id"] = user,
      })
    else
      reqs[i] = wrk.format("GET", path, { ["X-User"] = user })
    end
  end
end

function request()
  return reqs[math.random(#reqs)]
end
