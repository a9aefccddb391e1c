package sale

// SetAfterWarm sets the hook that runs once an admin change's warm has built
// a sale anew (the moment it becomes visible to buyers).
func SetAfterWarm(s *Service, f func(id int64)) { s.afterWarm = f }
