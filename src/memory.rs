//! The heap as glibc's allocator keeps it: what a long-lived process gives back once it is done
//! with a burst of allocations (a replica's reading of its crontab), so that an idle replica's
//! resident memory is what it holds, not what it once needed; and how a process that forks runs
//! keeps its children from copying the pages they share with it.

/// Give the heap's free pages back to the system (`malloc_trim(0)`, every arena: the crontab is
/// read on a thread of its own, whose arena keeps what the parse freed).
pub fn give_back() {
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its arenas' locks;
    // any thread may call it at any time.
    unsafe { libc::malloc_trim(0) };
}

/// Set the heap up for a process that forks often and whose children allocate (a replica's
/// starter): no "fast bins". A child's first larger allocation would otherwise merge every
/// small chunk the parent freed into its neighbours, writing to pages all over the heap it
/// shares with the parent, and the kernel copies each page written to (about 20 page copies
/// fewer per run, counted with the reaped runs' minor faults).
pub fn for_forking() {
    // SAFETY: mallopt only changes the allocator's own setting, under its lock; the process has
    // one thread here.
    unsafe { libc::mallopt(libc::M_MXFAST, 0) };
}
