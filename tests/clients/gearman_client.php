<?php
// PHP's gearman extension (php-gearman) as a new user drives gearhorn, for
// tests/integration/test_client_libraries.py. Usage:
//   php gearman_client.php call HOST PORT FUNCTION DATA        a foreground job: prints its end as JSON
//   php gearman_client.php background HOST PORT FUNCTION DATA  a background job: prints its handle
//   php gearman_client.php worker HOST PORT FUNCTION COUNT     takes COUNT jobs: prints each one's
//       length and sha256 as a JSON line; "throw:MSG" makes it throw (sendException), anything
//       else is answered "php:<length>:<sha256>" after a WORK_DATA and a WORK_STATUS.
[$_, $mode, $host, $port, $function, $arg] = $argv;

if ($mode === 'call') {
    $client = new GearmanClient();
    $client->addServer($host, (int)$port);
    $client->setTimeout(60000);
    $started = microtime(true);
    $result = $client->doNormal($function, $arg);
    $code = $client->returnCode();
    echo json_encode(['status' => $code === GEARMAN_SUCCESS ? 'complete' : 'failed',
                      'code' => $code, 'data' => $result, 'error' => $client->error(),
                      'seconds' => microtime(true) - $started]), "\n";
} elseif ($mode === 'background') {
    $client = new GearmanClient();
    $client->addServer($host, (int)$port);
    $handle = $client->doBackground($function, $arg);
    echo json_encode(['handle' => $handle, 'code' => $client->returnCode()]), "\n";
} elseif ($mode === 'worker') {
    $worker = new GearmanWorker();
    $worker->addServer($host, (int)$port);
    $worker->addFunction($function, function (GearmanJob $job) {
        $data = $job->workload();
        echo json_encode(['length' => strlen($data), 'sha256' => hash('sha256', $data)]), "\n";
        if (str_starts_with($data, 'throw:')) {
            $job->sendException(substr($data, 6));
            return '';
        }
        $job->sendData('working');
        $job->sendStatus(1, 1);
        return 'php:' . strlen($data) . ':' . hash('sha256', $data);
    });
    for ($done = 0; $done < (int)$arg; $done++) {
        if (!$worker->work()) {
            fwrite(STDERR, "worker: " . $worker->error() . "\n");
            exit(1);
        }
    }
}
