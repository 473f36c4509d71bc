#!/usr/bin/perl
# Perl's Gearman::Client and Gearman::Worker (libgearman-client-perl) as a
# new user drives gearhorn, for tests/integration/test_client_libraries.py.
# Usage as tests/clients/gearman_client.php; a job "throw:MSG" makes the
# worker die with MSG (Gearman::Worker sends it as WORK_EXCEPTION), anything
# else is answered "perl:<length>:<sha256>" after a WORK_STATUS.
use strict;
use warnings;
use Digest::SHA qw(sha256_hex);
use Gearman::Client;
use Gearman::Worker;
use JSON::PP;
use Time::HiRes qw(time);

$| = 1;
my ($mode, $host, $port, $function, $arg) = @ARGV;
my $json = JSON::PP->new->canonical;

if ($mode eq 'call') {
    my $client = Gearman::Client->new(job_servers => ["$host:$port"]);
    my $failed;
    my $started = time;
    my $result = $client->do_task($function, $arg,
                                  {timeout => 60, on_fail => sub { $failed = shift }});
    print $json->encode({status => defined $result ? 'complete' : 'failed',
                         data => defined $result ? $$result : undef,
                         error => $failed, seconds => time - $started}), "\n";
} elsif ($mode eq 'background') {
    my $client = Gearman::Client->new(job_servers => ["$host:$port"]);
    my $handle = $client->dispatch_background($function, $arg, {});
    print $json->encode({handle => $handle}), "\n";
} elsif ($mode eq 'worker') {
    my $worker = Gearman::Worker->new(job_servers => ["$host:$port"]);
    my $left = $arg;
    $worker->register_function($function => sub {
        my $job = shift;
        my $data = $job->arg;
        $left--;
        print $json->encode({length => length($data), sha256 => sha256_hex($data)}), "\n";
        die substr($data, 6) . "\n" if $data =~ /^throw:/;
        $job->set_status(1, 1);
        return 'perl:' . length($data) . ':' . sha256_hex($data);
    });
    # After a job that died, Gearman::Worker 2.004 sends WORK_EXCEPTION and
    # then WORK_FAIL; gearmand 1.1.20 ended the job at the first and answers
    # the second with ERROR JOB_NOT_FOUND, at which work() dies: go on.
    while ($left > 0) {
        eval { $worker->work(stop_if => sub { $left <= 0 }); 1 }
            or print STDERR "work() died (going on): $@";
    }
}
