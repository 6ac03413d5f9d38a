use super::*;

#[test]
fn lines_split_across_frames_are_joined() {
    let mut b = LineBuffer::default();
    b.push(b"{\"a\":");
    assert_eq!(b.next_line(), None);
    b.push(b"1}\n\n{\"b\"");
    assert_eq!(b.next_line().as_deref(), Some(&b"{\"a\":1}"[..]));
    assert_eq!(b.next_line(), None, "blank lines are skipped, partial lines wait");
    assert_eq!(b.pending(), 4);
    b.push(b":2}\n{\"c\":3}\n");
    assert_eq!(b.next_line().as_deref(), Some(&b"{\"b\":2}"[..]));
    assert_eq!(b.next_line().as_deref(), Some(&b"{\"c\":3}"[..]));
    assert_eq!(b.next_line(), None);
    assert_eq!(b.pending(), 0);
}

#[test]
fn many_lines_do_not_grow_the_buffer_without_bound() {
    let mut b = LineBuffer::default();
    let line = vec![b'x'; 1000];
    for _ in 0..1000 {
        b.push(&line);
        b.push(b"\n");
        assert_eq!(b.next_line().map(|l| l.len()), Some(1000));
    }
    assert!(b.buf.len() < 200 << 10, "consumed lines are dropped: {}", b.buf.len());
}

#[test]
fn a_long_line_in_small_frames_is_searched_once() {
    // A 16 MiB event (the most a watch accepts) in 8 KiB frames: searching the whole
    // pending line again on every frame took ~1.7e10 byte comparisons, minutes in a debug
    // build; searching each byte once takes well under a second.
    let started = std::time::Instant::now();
    let mut b = LineBuffer::default();
    let frame = vec![b'x'; 8 << 10];
    for _ in 0..(16 << 20) / frame.len() {
        b.push(&frame);
        assert_eq!(b.next_line(), None);
    }
    b.push(b"\n{}\n");
    assert_eq!(b.next_line().map(|l| l.len()), Some(16 << 20));
    assert_eq!(b.next_line().as_deref(), Some(&b"{}"[..]));
    assert_eq!(b.pending(), 0);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}: the buffer is searched more than once");
}
