package reservation

// SetMoveHook sets the store's hook between the steps of a move (tests).
func SetMoveHook(s *Store, f func(stage string) error) { s.moveHook = f }
