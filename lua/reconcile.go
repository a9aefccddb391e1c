package lua

// Sync makes a sale's Redis counters exact; see sync.lua.
var Sync = load("sync.lua", record)
