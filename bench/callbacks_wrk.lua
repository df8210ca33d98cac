-- wrk's script for bench_callbacks.py: each thread (one connection each) sends its own
-- prepared requests, read from "<prefix>.<thread>" (raw HTTP requests separated by NUL),
-- once each, then writes "<prefix>.<thread>.done": its answers by status and the monotonic
-- clock of its first request and last answer. wrk itself runs for a fixed duration, so the
-- bench stops it once every thread is done and times the round from these files.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } dp_timespec;
int clock_gettime(int clock, dp_timespec *ts);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("dp_timespec")

local function now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  prefix = args[1] .. "." .. id
  local file = assert(io.open(prefix, "rb"))
  local data = file:read("*a")
  file:close()
  requests = {}
  for raw in string.gmatch(data, "([^%z]+)") do
    requests[#requests + 1] = raw
  end
  answered, statuses, first, finished = 0, {}, nil, false
end

-- One connection per thread: the next request is the one after the last answered. (wrk
-- also calls this once before the run, in the first thread, to check the script.)
function request()
  if answered == 0 then
    first = now()
  end
  return requests[math.min(answered + 1, #requests)]
end

function response(status, headers, body)
  if finished then
    return
  end
  answered = answered + 1
  statuses[status] = (statuses[status] or 0) + 1
  if answered == #requests then
    finished = true
    local last = now()
    local out = assert(io.open(prefix .. ".done", "w"))
    out:write(string.format("%.6f %.6f", first, last))
    for code, count in pairs(statuses) do
      out:write(string.format(" %d:%d", code, count))
    end
    out:close()
    -- wrk reconnects after every answer a server closes: send that last connection where
    -- nothing listens, so that no web worker waits on it until wrk exits.
    wrk.thread.addr = wrk.lookup("127.0.0.1", "1")[1]
    wrk.thread:stop()
  end
end
