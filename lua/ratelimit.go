package lua

// RateLimit checks and takes slots of the proxy's sliding windows; see ratelimit.lua.
var RateLimit = load("ratelimit.lua")

// Instances is the proxy instances' heartbeat; see instances.lua.
var Instances = load("instances.lua")
