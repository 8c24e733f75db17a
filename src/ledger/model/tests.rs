use super::*;

#[test]
fn throughput_slides_over_the_minute_boundary() {
    let at_start = Throughput::over_last_minute((0, 0), (600, 6), 0.0);
    assert_eq!(at_start.processed_per_minute, 600.0);
    let half = Throughput::over_last_minute((300, 0), (600, 6), 30.0);
    assert_eq!(half.processed_per_minute, 600.0);
    assert_eq!(half.failed_per_minute, 3.0);
    let end = Throughput::over_last_minute((600, 1), (600, 6), 60.0);
    assert_eq!(end.processed_per_minute, 600.0);
    assert_eq!(end.failed_per_minute, 1.0);
}
